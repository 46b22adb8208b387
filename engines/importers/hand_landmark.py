"""MediaPipe's hand landmark models (full and lite), taken from the ``@mediapipe/hands`` npm package (Apache-2.0) and
converted to ONNX once.

``npm pack`` fetches the pinned package (nothing is installed, no script runs); ``hand_landmark_full.tflite``
(or ``hand_landmark_lite.tflite``) is read out of the tarball, checked against its pinned sha256 and converted
with ``tflite2onnx`` (the ``mesh-import`` extra, as for the face mesh). The palm detector of the same package is
not used: it is packed in an asset bundle and uses operators the converter refuses; callers run this model on a
region where a hand may be (around a face) and read its hand-presence score.

The converted model is rewritten to take any batch and given names that say what flows through it:
``image`` [N,3,224,224] float32 RGB 0..1 of the region, ``landmarks`` [N,21,3] in input pixels (wrist, then four
points along each finger from the thumb to the little finger), ``hand_score`` [N,1] (hand present, 0..1) and
``handedness`` [N,1].
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import onnx

from engines.errors import ModelError
from engines.importers.fdlite_wheel import import_converted, reshape_output, set_outputs
from engines.importers.npm_package import npm_pack, package_member

NPM_PACKAGE = "@mediapipe/hands"
NPM_VERSION = "0.4.1675469240"
# The package's two hand landmark models: the full one, and a lite one of the same contract at half the cost.
MODELS = {
    "hand_landmark": ("hand_landmark_full.tflite", "8c026882c9ec059ce0f8e75266bee5a9a23c341a40e0000df755374d3d1b9b68"),
    "hand_landmark_lite": (
        "hand_landmark_lite.tflite",
        "d7fde8ac11f8ce03f8663775bfc323f4fc9f2a38062b4f4efa142874ef5b2a48",
    ),
}
TFLITE_NAME, TFLITE_SHA256 = MODELS["hand_landmark"]
INPUT_SIZE = 224
POINTS = 21


def read_tflite(work: Path, tarball: Path | None = None, name: str = "hand_landmark") -> bytes:
    """The pinned .tflite of model `name` out of ``tarball`` (or a fresh ``npm pack`` into ``work``)."""
    member, sha256 = MODELS[name] if name != "hand_landmark" else (TFLITE_NAME, TFLITE_SHA256)
    source = tarball if tarball is not None else npm_pack(NPM_PACKAGE, NPM_VERSION, work)
    data = package_member(source, member, NPM_PACKAGE)
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ModelError(
            f"{member} from {source.name} has sha256 {digest}, expected {sha256}: use {NPM_PACKAGE}@{NPM_VERSION}"
        )
    return data


def _rename_io(model: onnx.ModelProto) -> onnx.ModelProto:
    """Name the input ``image``; keep landmarks [N,21,3], the presence score and handedness (the converted
    graph's first three outputs, in that order) and drop the world landmarks."""
    graph = model.graph
    if len(graph.input) != 1 or len(graph.output) != 4:
        raise ModelError(
            f"the converted hand landmark model has {len(graph.input)} inputs and {len(graph.output)} outputs, "
            "expected 1 and 4"
        )
    old_input = graph.input[0].name
    for node in graph.node:
        node.input[:] = ["image" if used == old_input else used for used in node.input]
    graph.input[0].name = "image"
    raw_points, raw_score, raw_side, _world = (output.name for output in graph.output)
    reshape_output(model, raw_points, "landmarks", [POINTS, 3])
    reshape_output(model, raw_score, "hand_score", [1])
    reshape_output(model, raw_side, "handedness", [1])
    return set_outputs(model, {"landmarks": [POINTS, 3], "hand_score": [1], "handedness": [1]})


def import_hand_landmark(dest_dir: Path, tarball: Path | None = None, name: str = "hand_landmark") -> Path:
    """Write ``<name>.onnx`` (batch-dynamic, checked item by item) into ``dest_dir``; return its path. ``tarball``:
    an ``npm pack`` of the pinned package already at hand (else npm fetches it); `name`: one of MODELS."""
    member, sha256 = MODELS[name] if name != "hand_landmark" else (TFLITE_NAME, TFLITE_SHA256)
    doc = (
        f"MediaPipe hand landmark model, {member} of npm {NPM_PACKAGE}@{NPM_VERSION} "
        f"(sha256 {sha256}). Input 'image' [N,3,{INPUT_SIZE},{INPUT_SIZE}] RGB 0..1; outputs "
        f"'landmarks' [N,{POINTS},3] in input pixels, 'hand_score' [N,1], 'handedness' [N,1]."
    )
    with tempfile.TemporaryDirectory(prefix="hands-npm-") as tmp:
        data = read_tflite(Path(tmp), tarball, name)
    return import_converted(
        Path(dest_dir) / f"{name}.onnx", lambda _work: data, "hand landmark model", _rename_io, doc, "image", INPUT_SIZE
    )
