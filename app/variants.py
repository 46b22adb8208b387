"""Reduced-precision variants and TensorRT plans of a model: the use-case behind `swapcast engines fp16|int8|
build-trt` and `swapcast bench-engines`.

Variants are written beside the model (`<stem>.fp16.onnx`, `<stem>.int8.onnx`, `<stem>.<gpu>.<precision>.engine`),
each with a JSON record of its source and quality; the pipeline loads them when SWAPCAST_PRECISION asks.
Models whose graph fixes the batch at 1 are made from their batch-dynamic rewrite, so every variant batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.errors import ModelError, UserError
from app.names import Precision
from app.settings import PipelineSettings
from engines import registry
from engines.model_files import ModelFiles
from engines.store import ModelStore, sha256_file

if TYPE_CHECKING:
    import numpy as np

    from engines.precision.int8 import CalibrationSet, Method, QdqTarget
    from engines.precision.quality import QualityReport
    from engines.tensorrt.manifest import EngineManifest

VERIFY_ITEMS = 4

__all__ = [
    "Source",
    "TrtPlanRequest",
    "build_trt_plan",
    "calibration_recognizer",
    "make_fp16",
    "make_int8",
    "source_for",
]


@dataclass(frozen=True)
class Source:
    """A model as variants are made from it: its registry file, the FP32 file that runs (the batch-dynamic
    rewrite of a fixed-batch graph) and the registry sha256 variants record."""

    name: str
    original: Path
    runnable: Path
    sha256: str

    @property
    def files(self) -> ModelFiles:
        return ModelFiles(self.original, self.sha256)


def source_for(store: ModelStore, name: str) -> Source:
    from engines.onnx_batch import rewrite_if_fixed_batch

    entry = registry.get_entry(name)
    if not entry.file.endswith(".onnx"):
        raise UserError(f"model {name} is not an ONNX model ({entry.file})")
    original = store.ensure(name)
    files = store.files(name)
    if files.sha256 is None:
        raise ModelError(f"model {name} has no recorded sha256 to tie its variants to")
    return Source(name, original, rewrite_if_fixed_batch(files), files.sha256)


def calibration_recognizer(choice: str, store: ModelStore, settings: PipelineSettings | None = None) -> str | None:
    """The recognizer that makes identity latents for a swapper's calibration: `none` (random unit latents),
    a model name, or `auto`: the configured recognizer when it is verified in the store."""
    if choice == "none":
        return None
    if choice != "auto":
        registry.get_entry(choice)
        return choice
    wanted = (settings or PipelineSettings()).recognizer_model
    return wanted if store.status(wanted) == "verified" else None


def _verify_feeds(calibration: CalibrationSet) -> dict[str, np.ndarray]:
    import numpy as np

    head = calibration.samples[:VERIFY_ITEMS]
    return {name: np.concatenate([s[name] for s in head]) for name in calibration.input_names}


def _tool(package: str) -> str:
    try:
        return f"{package} {metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return package


def _write_record(
    source: Source, dst: Path, precision: str, package: str, options: dict[str, Any], quality: QualityReport
) -> None:
    """The JSON record beside variant `dst`: its source, the tool that made it, how, and its quality."""
    from engines.precision.variants import VariantRecord, write_record

    record = VariantRecord(
        model=source.name,
        precision=precision,
        file=dst.name,
        sha256=sha256_file(dst),
        source_file=source.original.name,
        source_sha256=source.sha256,
        tool=_tool(package),
        options=options,
        quality={**quality.to_dict(), "inputs": "first calibration samples"},
    )
    write_record(dst, record)


def make_fp16(
    store: ModelStore, name: str, block_ops: tuple[str, ...] = (), recognizer: str | None = None
) -> tuple[Path, QualityReport]:
    """Write `<stem>.fp16.onnx` and its record; returns (path, QualityReport on real inputs)."""
    from app.calibration import calibration_set
    from engines.precision.fp16 import convert_fp16
    from engines.precision.quality import measure

    source = source_for(store, name)
    calibration = calibration_set(store, name, source.runnable, VERIFY_ITEMS, recognizer_model=recognizer)
    feeds = _verify_feeds(calibration)
    dst = source.files.variant("fp16")
    ranges = {k: v[:2] for k, v in feeds.items()}  # every activation is held: two samples bound the memory
    result = convert_fp16(source.runnable, dst, extra_block_ops=block_ops, range_feeds=ranges)
    quality = measure(source.runnable, dst, feeds)
    options = {
        "keep_io_types": result.keep_io_types,
        "extra_block_ops": list(block_ops),
        "blocked_nodes": list(result.blocked_nodes),
    }
    _write_record(source, dst, "fp16", "onnxconverter-common", options, quality)
    return dst, quality


def make_int8(
    store: ModelStore,
    name: str,
    *,
    method: Method = "minmax",
    per_channel: bool = True,
    samples: int | None = None,
    recognizer: str | None = None,
    target: QdqTarget = "onnxruntime",
    float16_rest: bool = False,
) -> tuple[Path, QualityReport]:
    """Write `<stem>.int8.onnx` (or `<stem>.int8-trt.onnx`, the form TensorRT parses, for target "tensorrt")
    and its record; returns (path, QualityReport on calibration inputs)."""
    from app.calibration import calibration_set
    from engines.precision.int8 import quantize_int8
    from engines.precision.quality import measure

    source = source_for(store, name)
    calibration = calibration_set(store, name, source.runnable, samples, recognizer_model=recognizer)
    dst = source.files.tensorrt_qdq if target == "tensorrt" else source.files.variant("int8")
    result = quantize_int8(
        source.runnable,
        dst,
        calibration,
        method=method,
        per_channel=per_channel,
        target=target,
        float16_rest=float16_rest,
    )
    quality = measure(source.runnable, dst, _verify_feeds(calibration), optimize=not float16_rest)
    options = {**result.options(), "calibration_source": calibration.source}
    _write_record(source, dst, "int8", "onnxruntime", options, quality)
    return dst, quality


@dataclass(frozen=True)
class TrtPlanRequest:
    """What `swapcast engines build-trt` asks for."""

    name: str
    precision: Precision
    max_batch: int = 32
    opt_batch: int | None = None
    samples: int | None = None
    recognizer: str = "auto"
    workspace_gib: float = 4.0


def _profile_dims(name: str, detect_size: int) -> dict[str, tuple[int, int, int]]:
    role = registry.get_entry(name).role
    if role == "detector":
        return {"height": (32, detect_size, detect_size), "width": (32, detect_size, detect_size)}
    if role == "enhancer":
        return {"height": (32, 128, 256), "width": (32, 128, 256)}
    return {}


def build_trt_plan(
    store: ModelStore, request: TrtPlanRequest, settings: PipelineSettings
) -> tuple[Path, EngineManifest]:
    """Build a TensorRT plan (`<stem>.<gpu>.<precision>.engine` + manifest) of a model for this GPU."""
    from engines.tensorrt.manifest import import_tensorrt, probe_platform

    import_tensorrt()  # before any work: one clear line on machines without TensorRT
    registry.get_entry(request.name)
    from app.calibration import calibration_set
    from engines.tensorrt.build import BuildOptions
    from engines.tensorrt.build import build_engine as build_plan

    platform = probe_platform()
    source = source_for(store, request.name)
    plan = source.files.engine(platform.gpu_name, request.precision)
    calibration = None
    if request.precision == "int8":
        recognizer = calibration_recognizer(request.recognizer, store, settings)
        calibration = calibration_set(
            store, request.name, source.runnable, request.samples, recognizer_model=recognizer
        )
    options = BuildOptions(
        precision=request.precision,
        max_batch=request.max_batch,
        opt_batch=request.opt_batch,
        dims=_profile_dims(request.name, settings.detect_size),
        workspace_gib=request.workspace_gib,
        timing_cache=source.files.timing_cache(platform.gpu_name, platform.tensorrt_version),
        calibration=calibration,
        calibration_cache=(
            source.files.calibration_cache(
                platform.gpu_name, request.precision, calibration.digest(), platform.tensorrt_version
            )
            if calibration is not None
            else None
        ),
    )
    try:
        manifest = build_plan(source.runnable, plan, model=request.name, source_sha256=source.sha256, options=options)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return plan, manifest
