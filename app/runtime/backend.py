"""Pick and load the runtime for a model: ONNX Runtime, TensorRT or PyTorch, at the precision asked for.

`choose` decides, from the files beside the model and what this machine has, which file runs on which
backend; `load_backend` loads it. Variants (see `engines.precision.variants`) are named after the model
they were made from (`source`), which can differ from the file that runs at FP32 (a fixed-batch graph
runs from its batch-dynamic rewrite).

backend "auto":
  1. a TensorRT engine for this GPU, this TensorRT version and this model at the asked precision;
  2. else PyTorch on CUDA (fp32, or half for fp16) when torch and a GPU are there (not for int8);
  3. else ONNX Runtime: the `.fp16.onnx` / `.int8.onnx` variant when the precision asks for one and it
     is valid, otherwise FP32 (the log says which variant to make).
An explicit backend never falls back: a missing or mismatched variant or engine is a ModelError saying
how to make it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from app.errors import ModelError
from app.names import LocalBackend, Precision, RunBackend
from app.runtime.model import Model
from app.runtime.onnx import OnnxModel
from engines.model_files import ModelFiles
from engines.precision.variants import check_variant
from engines.tensorrt.manifest import EngineMismatch, Platform, probe_platform, verify_engine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    backend: RunBackend
    path: Path
    precision: Precision
    reason: str


@functools.lru_cache(maxsize=1)
def gpu_platform() -> Platform | None:
    """This machine's GPU and TensorRT version, or None without TensorRT, CUDA bindings or a GPU."""
    try:
        return probe_platform()
    except ModelError as exc:
        log.debug("no TensorRT platform here: %s", exc)
        return None


@functools.lru_cache(maxsize=1)
def torch_cuda() -> bool:
    """Whether PyTorch is installed and sees a CUDA device (torch is only imported where a driver is)."""
    if not (Path("/proc/driver/nvidia/version").exists() or Path("/dev/nvidiactl").exists()):
        return False
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def _onnx_variant(source: Path, precision: Precision, source_sha256: str | None) -> tuple[Path | None, str]:
    candidate = ModelFiles(source, source_sha256).variant(precision)
    if not candidate.is_file():
        return None, f"no {precision} variant ({candidate.name}): run `swapcast engines {precision} MODEL`"
    try:
        check_variant(candidate, source_sha256)
    except ModelError as exc:
        return None, str(exc)
    return candidate, f"{candidate.name} (ONNX Runtime, {precision})"


def _engine(
    source: Path, precision: Precision, source_sha256: str | None, platform: Platform | None
) -> tuple[Path | None, str]:
    if platform is None:
        return None, "no TensorRT here (TensorRT, the CUDA bindings or a GPU is missing)"
    candidate = ModelFiles(source, source_sha256).engine(platform.gpu_name, precision)
    if not candidate.is_file():
        return None, f"no engine {candidate.name}: run `swapcast engines build-trt MODEL --precision {precision}`"
    try:
        verify_engine(candidate, platform, source_sha256)
    except EngineMismatch as exc:
        return None, str(exc)
    return candidate, f"{candidate.name} (TensorRT, {precision})"


def choose(
    path: Path,
    backend: LocalBackend = "auto",
    precision: Precision = "fp32",
    *,
    source: Path | None = None,
    source_sha256: str | None = None,
    platform: Platform | None = None,
    cuda: bool | None = None,
) -> Choice:
    """Which file runs on which backend (see the module notes). `platform` and `cuda` default to probing
    this machine."""
    path = Path(path)
    source = Path(source) if source is not None else path
    if backend == "tensorrt" or (backend == "auto" and _has_engines(source, precision)):
        found, why = _engine(source, precision, source_sha256, platform if platform is not None else gpu_platform())
        if found is not None:
            return Choice("tensorrt", found, precision, why)
        if backend == "tensorrt":
            raise ModelError(f"{source.name}: cannot run on TensorRT at {precision}: {why}")
        log.info("%s: %s", source.name, why)
    on_cuda = torch_cuda() if cuda is None else cuda
    if backend == "torch" or (backend == "auto" and on_cuda and precision != "int8"):
        if precision == "int8":
            raise ModelError("the torch backend has no INT8 path: use --backend onnxruntime or tensorrt for int8")
        device = "CUDA" if on_cuda else "CPU"
        ran = precision if on_cuda else "fp32"
        return Choice("torch", path, ran, f"{path.name} (PyTorch on {device}, {ran})")
    if precision == "fp32":
        return Choice("onnxruntime", path, "fp32", f"{path.name} (ONNX Runtime, fp32)")
    found, why = _onnx_variant(source, precision, source_sha256)
    if found is not None:
        return Choice("onnxruntime", found, precision, why)
    if backend == "onnxruntime":
        raise ModelError(f"{source.name}: cannot run at {precision} on ONNX Runtime: {why}")
    log.warning("%s: %s; running FP32", source.name, why)
    return Choice("onnxruntime", path, "fp32", f"{path.name} (ONNX Runtime, fp32; {why})")


def _has_engines(source: Path, precision: Precision) -> bool:
    return bool(ModelFiles(source).engines(precision))


def load_backend(
    path: Path,
    backend: LocalBackend = "auto",
    threads: int | None = None,
    precision: Precision = "fp32",
    *,
    source: Path | None = None,
    source_sha256: str | None = None,
) -> Model:
    """Load `path` (an FP32 ONNX model) or the variant of `source` that `choose` picks."""
    choice = choose(path, backend, precision, source=source, source_sha256=source_sha256)
    log.info("loading %s", choice.reason)
    if choice.backend == "tensorrt":
        from app.runtime.tensorrt import TensorRTModel

        return TensorRTModel(choice.path, source_sha256=source_sha256, platform=gpu_platform())
    if choice.backend == "torch":
        from app.runtime.torch_backend import TorchModel

        return TorchModel(choice.path, precision="fp16" if choice.precision == "fp16" else "fp32", threads=threads)
    model = OnnxModel(choice.path, threads=threads)
    if choice.precision == "fp16" and model.providers[:1] == ["CPUExecutionProvider"]:
        _say_fp16_is_slow_on_cpu(choice.path)
    return model


@functools.cache
def _say_fp16_is_slow_on_cpu(variant: Path) -> None:
    """Once per process and model. ONNX Runtime's CPU provider has FP16 kernels for few ops and wraps the
    others in casts to FP32 and back. Measured on two CPU cores, FP16 variants ran at 0.74-0.77x FP32's
    speed (bench-engines) and 0.84-0.85x (RetinaFace at 640, animevideov3 x2 on 4 crops: median of 15
    interleaved runs, 2 threads)."""
    log.warning(
        "%s: SWAPCAST_PRECISION=fp16 runs slower than fp32 on a CPU (ONNX Runtime computes most FP16 ops in "
        "FP32 with casts around them; measured 0.74-0.85x fp32's speed): fp16 pays off on a GPU, "
        "compare the variants here with `swapcast bench-engines`",
        variant.name,
    )


@dataclass(frozen=True)
class VariantInfo:
    """One file that can run a model, for `swapcast models list --variants`."""

    file: str
    kind: Literal["onnx", "engine"]
    precision: str
    status: str  # ok, or why it would be refused here
    active: bool


def list_variants(
    source: Path,
    source_sha256: str | None,
    backend: LocalBackend,
    precision: Precision,
    *,
    runs_from: Path | None = None,
) -> list[VariantInfo]:
    """Every variant file beside `source`, whether it may run here, and which one the settings would load."""
    source = Path(source)
    runs_from = runs_from or source
    try:
        active: Path | None = choose(runs_from, backend, precision, source=source, source_sha256=source_sha256).path
    except ModelError:
        active = None
    rows = [VariantInfo(source.name, "onnx", "fp32", "ok", active in (source, runs_from))]
    files = ModelFiles(source, source_sha256)
    reduced: tuple[Precision, ...] = ("fp16", "int8")
    for name in reduced:
        candidate = files.variant(name)
        if candidate.is_file():
            try:
                check_variant(candidate, source_sha256)
                status = "ok"
            except ModelError as exc:
                status = str(exc)
            rows.append(VariantInfo(candidate.name, "onnx", name, status, candidate == active))
    platform = None
    for engine in files.engines():
        if platform is None:
            platform = gpu_platform()
        status = "cannot check here (no TensorRT or GPU)"
        if platform is not None:
            try:
                verify_engine(engine, platform, source_sha256)
                status = "ok"
            except EngineMismatch as exc:
                status = str(exc)
        rows.append(VariantInfo(engine.name, "engine", engine.name.split(".")[-2], status, engine == active))
    return rows
