"""Names the settings, the CLI and the runtime share, each defined once.

"engine" alone is ambiguous in this project: a *swap engine* is the model family that replaces faces
(`SwapEngineName`), a *TensorRT plan* is a compiled model file (see `engines.tensorrt`), and `engines/` is the
model supply chain package (with its `swapcast engines` CLI group).
"""

from typing import Any, Literal, get_args

from engines.precision.variants import Precision

SwapEngineName = Literal["inswapper", "mesh", "classic", "passthrough"]
# "auto": inswapper when its weights are in the model directory, else mesh when its landmark model is imported or
# importable, else classic (what `swapcast serve` and `swapcast swap` run unless told otherwise).
SwapEngineChoice = Literal["auto", SwapEngineName]
# The runtimes a model can run on in this process; "auto" picks a TensorRT plan built for this GPU, else
# PyTorch on CUDA, else ONNX Runtime (app.runtime.backend).
RunBackend = Literal["onnxruntime", "tensorrt", "torch"]
LocalBackend = Literal["auto", RunBackend]
# "triton": face crops and latents go to a Triton server (SWAPCAST_TRITON_URL); detection stays local.
BackendName = Literal[LocalBackend, "triton"]
# What live video shows where a swapped face was lost by the detector (app.pipeline.track): `hold` freezes
# its last swapped look there, `cover` pixelates it, `pass` shows the frame as it is (the real face).
FaceLostPolicy = Literal["hold", "cover", "pass"]
OcclusionMode = Literal["off", "hands", "auto"]


def literal_values(kind: Any) -> tuple[str, ...]:
    """Every string a Literal (or a union of Literals) allows, in order: argparse `choices` and messages."""
    values: list[str] = []
    for arg in get_args(kind):
        values.extend(literal_values(arg) if get_args(arg) else [arg])
    return tuple(values)


SWAP_ENGINES = literal_values(SwapEngineName)
SWAP_ENGINE_CHOICES = literal_values(SwapEngineChoice)
BACKENDS = literal_values(BackendName)
FACE_LOST_POLICIES = literal_values(FaceLostPolicy)
OCCLUSION_MODES = literal_values(OcclusionMode)
PRECISIONS = literal_values(Precision)

__all__ = [
    "BACKENDS",
    "FACE_LOST_POLICIES",
    "PRECISIONS",
    "SWAP_ENGINES",
    "SWAP_ENGINE_CHOICES",
    "BackendName",
    "FaceLostPolicy",
    "OcclusionMode",
    "OCCLUSION_MODES",
    "LocalBackend",
    "Precision",
    "RunBackend",
    "SwapEngineChoice",
    "SwapEngineName",
    "literal_values",
]
