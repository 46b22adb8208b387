"""`swapcast triton export --out DIR`: a Triton Inference Server model repository from the local models.

Batching follows swapcast's own batcher settings (SWAPCAST_BATCH_*): the same largest batch per stage, the
same wait to fill a batch, and queue timeouts equal to the batch deadline.
"""

import argparse
from pathlib import Path

from app.commands.arguments import positive_int
from app.errors import UserError
from app.model_store import open_model_store
from app.names import PRECISIONS
from app.settings import BatchingSettings
from engines import registry
from engines.errors import ModelError
from engines.store import ModelStore
from engines.triton.config import PLATFORMS, BatchingSpec, InstanceKind, Platform, ServingSpec
from engines.triton.repository import ModelSource, export_repository


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("triton", help="serve the models from NVIDIA Triton Inference Server")
    actions = p.add_subparsers(dest="triton_command", required=True, metavar="{export}")
    export = actions.add_parser(
        "export",
        help="write a Triton model repository from the local models",
        description="With no --models, every model present and verified in the model directory.",
    )
    export.add_argument("--out", type=Path, required=True, help="the model repository directory")
    export.add_argument("--models", nargs="+", default=None, metavar="NAME", help="models to export")
    export.add_argument(
        "--platform",
        choices=PLATFORMS,
        default="onnxruntime",
        help="onnxruntime (ONNX Runtime backend), tensorrt (plans built by `swapcast engines build-trt`), "
        "or python (ONNX Runtime inside Triton's python backend; the only backend of the pip tritonserver)",
    )
    export.add_argument("--instance-kind", choices=("cpu", "gpu"), default=None, help="default: gpu for tensorrt")
    export.add_argument("--instances", type=positive_int, default=1, help="model instances per server (default 1)")
    export.add_argument("--threads", type=positive_int, default=1, help="threads per CPU instance (default 1)")
    export.add_argument(
        "--precision", choices=PRECISIONS, default="fp16", help="TensorRT plan precision to export (default fp16)"
    )
    export.set_defaults(func=run_export)


def stage_batch(role: str, batching: BatchingSettings) -> int:
    """The largest batch swapcast's own batcher uses for a model of this role."""
    if role == "detector":
        return batching.detect_max_batch
    if role == "enhancer":
        return batching.enhance_max_batch
    return batching.swap_max_batch


def run_export(args: argparse.Namespace) -> int:
    platform: Platform = args.platform
    kind: InstanceKind = args.instance_kind or ("gpu" if platform == "tensorrt" else "cpu")
    if platform == "python" and kind == "gpu":
        raise UserError("the python-backend models run ONNX Runtime on the CPU: use --instance-kind cpu")
    store = open_model_store()
    names = args.models or [e.name for e in registry.entries() if store.status(e.name) == "verified"]
    if not names:
        raise UserError(f"no verified models in {store.root}: run `swapcast models import` first")
    batching = BatchingSettings()
    sources = [_source(store, name, platform, batching, args.precision) for name in names]
    serving = ServingSpec(platform, kind, args.instances, args.threads)
    for model in export_repository(sources, args.out, serving):
        batch = f"max batch {model.max_batch_size}" if model.max_batch_size else "unbatched"
        print(f"{model.name}: {model.directory} ({platform}, {batch})")
    return 0


def _source(
    store: ModelStore, name: str, platform: Platform, batching: BatchingSettings, precision: str
) -> ModelSource:
    try:
        entry = registry.get_entry(name)
    except ModelError as exc:
        raise UserError(str(exc)) from None
    onnx = store.path(name)
    spec = BatchingSpec(
        max_batch=stage_batch(entry.role, batching),
        max_queue_delay_ms=batching.max_delay_ms,
        deadline_ms=batching.deadline_ms,
        max_queue=batching.max_queue,
    )
    if platform != "tensorrt":
        return ModelSource(name, onnx, spec)
    from engines.tensorrt.manifest import probe_platform, read_manifest

    plan = store.files(name).engine(probe_platform().gpu_name, precision)
    if not plan.is_file():
        return ModelSource(name, onnx, spec)  # the export says how to build it
    return ModelSource(name, onnx, spec, plan=plan, plan_max_batch=read_manifest(plan).max_batch)
