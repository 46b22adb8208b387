"""Write a Triton model repository from local model files: `<out>/<name>/config.pbtxt` and
`<out>/<name>/1/model.{onnx,plan}` (plus `model.py` for the python backend).

Each model directory is written file by file through the atomic helper with `config.pbtxt` last, so Triton
never sees a model whose files are half there; a failed export removes the model directories it created.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from engines.atomic import atomic_path, write_bytes_atomic
from engines.errors import ModelError
from engines.onnx_batch import make_batch_dynamic
from engines.triton.config import MODEL_FILES, BatchingSpec, ServingSpec, build_config, config_text
from engines.triton.onnx_signature import Signature, read_signature

VERSION = "1"
BACKEND_MODEL = Path(__file__).with_name("backend_model.py")


@dataclass(frozen=True)
class ModelSource:
    """One model to serve: its ONNX file (the signature comes from it), its batching, and for TensorRT the
    plan built from it with the largest batch the plan's profile accepts."""

    name: str
    onnx: Path
    batching: BatchingSpec
    plan: Path | None = None
    plan_max_batch: int | None = None


@dataclass(frozen=True)
class ExportedModel:
    name: str
    directory: Path
    max_batch_size: int
    signature: Signature


def export_repository(models: Sequence[ModelSource], out: Path, serving: ServingSpec) -> list[ExportedModel]:
    if not models:
        raise ModelError("no models to export")
    if out.exists() and not out.is_dir():
        raise ModelError(f"{out} exists and is not a directory")
    for model in models:
        target = out / model.name
        if target.exists() and not (target / "config.pbtxt").is_file():
            raise ModelError(f"{target} exists and is not a Triton model directory; choose another --out")
    created: list[Path] = []
    exported: list[ExportedModel] = []
    try:
        for model in models:
            target = out / model.name
            if not target.exists():
                created.append(target)
            exported.append(_export_one(model, target, serving))
    except BaseException:
        for directory in created:
            shutil.rmtree(directory, ignore_errors=True)
        raise
    return exported


def _export_one(model: ModelSource, target: Path, serving: ServingSpec) -> ExportedModel:
    version = target / VERSION
    version.mkdir(parents=True, exist_ok=True)
    signature = read_signature(model.onnx)
    if serving.platform == "tensorrt":
        if model.plan is None:
            raise ModelError(
                f"model {model.name} has no TensorRT engine for this GPU: "
                f"build it first with `swapcast engines build-trt {model.name} --precision fp16`"
            )
        _copy(model.plan, version / MODEL_FILES["tensorrt"])
        # Plans are built with a batch profile (from the batch-dynamic rewrite where the ONNX fixes it at 1).
        signature = replace(signature, batch_dynamic=True)
    else:
        signature = _place_onnx(model, version / "model.onnx", signature)
        if serving.platform == "python":
            write_bytes_atomic(version / "model.py", BACKEND_MODEL.read_bytes())
    config = build_config(model.name, signature, model.batching, serving, max_batch_cap=model.plan_max_batch)
    write_bytes_atomic(target / "config.pbtxt", config_text(config).encode())
    return ExportedModel(model.name, target, int(config.max_batch_size), signature)


def _place_onnx(model: ModelSource, dst: Path, signature: Signature) -> Signature:
    """Copy the ONNX file; a model whose batch is fixed at 1 is rewritten to take any batch (checked item by
    item against the original) so Triton can batch it, and served unbatched where that rewrite is unsound."""
    fixed_at_one = all(spec.leading == 1 for spec in (*signature.inputs, *signature.outputs))
    if signature.batch_dynamic or not fixed_at_one or model.batching.max_batch == 1:
        _copy(model.onnx, dst)
        return signature
    try:
        make_batch_dynamic(model.onnx, dst)
    except ModelError:
        _copy(model.onnx, dst)
        return signature
    return read_signature(dst)


def _copy(src: Path, dst: Path) -> None:
    if not src.is_file():
        raise ModelError(f"model file {src} is missing")
    with atomic_path(dst) as tmp:
        shutil.copyfile(src, tmp)
