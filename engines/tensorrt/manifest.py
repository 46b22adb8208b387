"""The sidecar manifest of a TensorRT engine, and the check that refuses an engine before it is deserialised.

A serialized engine only runs on the TensorRT version that built it and is tuned for one GPU; loading
one built elsewhere fails deep inside TensorRT, or worse, runs with kernels picked for another card.
So every `.engine` gets a JSON manifest beside it (`<stem>.<gpu>.<precision>.json`, named in
engines.model_files) saying what it was built from (the source model's sha256), how (precision, build
mode, optimisation profile) and where (GPU name, compute capability, TensorRT version). `verify_engine`
compares it with the running platform and the model the caller expects, and also checks the engine
file's own sha256, before any byte of the engine reaches TensorRT; every mismatch is named in the
one-line error.

Nothing here imports TensorRT or CUDA: `probe_platform` does, lazily, when asked.
"""

from __future__ import annotations

import importlib
import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from engines.atomic import write_text_atomic
from engines.errors import ModelError
from engines.model_files import gpu_slug, record_path

MANIFEST_FORMAT = 1
TRT_MISSING = "TensorRT is not installed: pip install swapcast[gpu] on a machine with an NVIDIA GPU"


class EngineMismatch(ModelError):
    """The engine may not be deserialised here: its manifest is missing, unreadable or does not match."""


@dataclass(frozen=True, slots=True)
class Platform:
    """What a serialized engine is tied to."""

    gpu_name: str
    compute_capability: str  # "9.0"
    tensorrt_version: str

    @property
    def slug(self) -> str:
        return gpu_slug(self.gpu_name)


@dataclass(frozen=True)
class ProfileShape:
    """One input's optimisation profile: the smallest, tuned-for and largest shapes the engine accepts."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __post_init__(self) -> None:
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError(f"profile shapes differ in rank: {self.min}, {self.opt}, {self.max}")
        for low, mid, high in zip(self.min, self.opt, self.max, strict=True):
            if not 0 < low <= mid <= high:
                raise ValueError(f"profile needs 0 < min <= opt <= max per axis: {self.min}, {self.opt}, {self.max}")

    def accepts(self, shape: tuple[int, ...]) -> bool:
        return len(shape) == len(self.min) and all(
            low <= s <= high for s, low, high in zip(shape, self.min, self.max, strict=True)
        )

    def to_dict(self) -> dict[str, list[int]]:
        return {"min": list(self.min), "opt": list(self.opt), "max": list(self.max)}

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> ProfileShape:
        return cls(*(tuple(int(v) for v in raw[key]) for key in ("min", "opt", "max")))


@dataclass(frozen=True)
class EngineManifest:
    model: str
    precision: str
    source_file: str
    source_sha256: str
    engine_sha256: str
    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    build_mode: str  # "builder-flags" (TensorRT 10) or "strongly-typed" (from FP16/QDQ ONNX)
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    profiles: dict[str, ProfileShape]
    calibration: str | None = None  # digest of the calibration data for INT8
    rewrites: tuple[str, ...] = ()  # changes made so TensorRT could parse the model (e.g. cubic Resize -> linear)
    created: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    format: int = MANIFEST_FORMAT

    @property
    def max_batch(self) -> int:
        return min(p.max[0] for p in self.profiles.values()) if self.profiles else 1

    def to_json(self) -> str:
        body = asdict(self)
        body["profiles"] = {name: shape.to_dict() for name, shape in self.profiles.items()}
        body["inputs"] = list(self.inputs)
        body["outputs"] = list(self.outputs)
        body["rewrites"] = list(self.rewrites)
        return json.dumps(body, indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str) -> EngineManifest:
        raw = json.loads(text)
        if not isinstance(raw, dict):
            raise TypeError("not a JSON object")
        if raw.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"manifest format {raw.get('format')!r}, expected {MANIFEST_FORMAT}")
        raw["profiles"] = {name: ProfileShape.from_dict(shape) for name, shape in raw["profiles"].items()}
        raw["inputs"] = tuple(raw["inputs"])
        raw["outputs"] = tuple(raw["outputs"])
        raw["rewrites"] = tuple(raw.get("rewrites", ()))
        return cls(**raw)


def write_manifest(engine: Path, manifest: EngineManifest) -> Path:
    return write_text_atomic(record_path(engine), manifest.to_json())


def read_manifest(engine: Path) -> EngineManifest:
    """The manifest beside `engine`; EngineMismatch when it is missing or unreadable."""
    engine = Path(engine)
    path = record_path(engine)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EngineMismatch(
            f"refusing engine {engine.name}: it has no manifest ({path.name}); "
            "rebuild it with `swapcast engines build-trt`"
        ) from None
    except OSError as exc:
        raise EngineMismatch(f"refusing engine {engine.name}: cannot read its manifest {path.name} ({exc})") from None
    try:
        return EngineManifest.from_json(text)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise EngineMismatch(
            f"refusing engine {engine.name}: its manifest {path.name} is corrupt ({type(exc).__name__}: {exc}); "
            "rebuild it with `swapcast engines build-trt`"
        ) from None


def mismatch_reasons(manifest: EngineManifest, platform: Platform, source_sha256: str | None) -> list[str]:
    """Why this engine may not run here, one short phrase per reason (empty when it may)."""
    reasons = []
    if manifest.gpu_name != platform.gpu_name:
        reasons.append(f"built for GPU {manifest.gpu_name!r}, this GPU is {platform.gpu_name!r}")
    if manifest.compute_capability != platform.compute_capability:
        reasons.append(
            f"built for compute capability {manifest.compute_capability}, this GPU has {platform.compute_capability}"
        )
    if manifest.tensorrt_version != platform.tensorrt_version:
        reasons.append(f"built with TensorRT {manifest.tensorrt_version}, this is TensorRT {platform.tensorrt_version}")
    if source_sha256 is not None and manifest.source_sha256 != source_sha256:
        reasons.append(
            f"built from {manifest.source_file} with sha256 {manifest.source_sha256[:12]}, "
            f"the model now has sha256 {source_sha256[:12]}"
        )
    return reasons


def verify_engine(engine: Path, platform: Platform, source_sha256: str | None) -> EngineManifest:
    """The engine's manifest if the engine was built here, from this model, and is intact.

    Reads only the JSON manifest and hashes the engine file; never deserialises it. Raises
    EngineMismatch naming every reason otherwise.
    """
    from engines.store import check_file

    engine = Path(engine)
    if not engine.is_file():
        raise EngineMismatch(f"no TensorRT engine at {engine}: build it with `swapcast engines build-trt`")
    manifest = read_manifest(engine)
    reasons = mismatch_reasons(manifest, platform, source_sha256)
    if reasons:
        raise EngineMismatch(
            f"refusing engine {engine.name}: {'; '.join(reasons)}; rebuild it here with `swapcast engines build-trt`"
        )
    if not check_file(engine, manifest.engine_sha256):
        raise EngineMismatch(
            f"refusing engine {engine.name}: the file does not match the sha256 in its manifest (damaged or replaced); "
            "rebuild it with `swapcast engines build-trt`"
        )
    return manifest


def probe_platform() -> Platform:
    """GPU 0's name and compute capability and the installed TensorRT version.

    Imports TensorRT and the CUDA runtime bindings; ModelError when either is missing or there is no GPU.
    """
    trt = import_tensorrt()
    cudart = import_cudart()
    err, props = cudart.cudaGetDeviceProperties(0)
    check_cuda(cudart, err, "cudaGetDeviceProperties")
    name = props.name.decode(errors="replace") if isinstance(props.name, bytes) else str(props.name)
    return Platform(name.rstrip("\x00").strip(), f"{props.major}.{props.minor}", str(trt.__version__))


def import_tensorrt() -> Any:
    try:
        return importlib.import_module("tensorrt")
    except ImportError:
        raise ModelError(TRT_MISSING) from None


def import_cudart() -> Any:
    """The CUDA runtime bindings of cuda-python (`cuda.bindings.runtime` from 12.6 on, `cuda.cudart` before)."""
    for module in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(module)
        except ImportError:
            continue
    raise ModelError(
        "the CUDA runtime bindings are not installed: pip install swapcast[gpu] on a machine with an NVIDIA GPU"
    )


def native_handle(obj: Any) -> int:
    """The address a cuda-python object wraps (a stream's `cudaStream_t`), for APIs that take it as an int
    (TensorRT's `execute_async_v3`). cuda-bindings 12.9.1 deprecates `int(obj)` for
    `cuda.bindings.utils.get_cuda_native_handle`; older bindings have only `int`."""
    try:
        from cuda.bindings.utils import get_cuda_native_handle
    except ImportError:
        return int(obj)
    try:
        return int(get_cuda_native_handle(obj))
    except TypeError:  # not a type the helper knows (an int already, or an older binding's object)
        return int(obj)


def check_cuda(cudart: Any, err: Any, call: str) -> None:
    """Raise ModelError unless `err` (the first item cuda-python returns) is cudaSuccess."""
    if err != cudart.cudaError_t.cudaSuccess:
        name = getattr(err, "name", str(err))
        raise ModelError(f"CUDA call {call} failed: {name}")
