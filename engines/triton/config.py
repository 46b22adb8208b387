"""`config.pbtxt` for one model, built as Triton's own ModelConfig protobuf so that only valid fields exist."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from engines.errors import ModelError
from engines.triton.onnx_signature import Signature, TensorSpec

Platform = Literal["python", "onnxruntime", "tensorrt"]
InstanceKind = Literal["cpu", "gpu"]
PLATFORMS: tuple[Platform, ...] = ("python", "onnxruntime", "tensorrt")
# The file Triton loads: for the python backend its model.py, which runs the model.onnx beside it.
MODEL_FILES: dict[Platform, str] = {"python": "model.py", "onnxruntime": "model.onnx", "tensorrt": "model.plan"}


@dataclass(frozen=True)
class BatchingSpec:
    """Triton's dynamic batcher, set from the same knobs as swapcast's own batcher: the largest batch, how
    long a batch may wait to fill, how long an item may queue before it is refused (swapcast's deadline: a
    frame older than that is worth nothing to a live stream), and how many items may queue."""

    max_batch: int
    max_queue_delay_ms: float
    deadline_ms: float | None
    max_queue: int

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_queue < 1 or self.max_queue_delay_ms < 0:
            raise ModelError(f"invalid batching settings for Triton: {self}")

    def preferred_sizes(self) -> list[int]:
        """Powers of two up to the largest batch, and the largest batch itself."""
        sizes = [size for size in (2, 4, 8, 16, 32, 64, 128, 256) if size < self.max_batch]
        return [*sizes, self.max_batch] if self.max_batch > 1 else []


@dataclass(frozen=True)
class ServingSpec:
    platform: Platform
    instance_kind: InstanceKind
    instances: int
    threads: int = 1  # intra-op threads per instance (python backend and ONNX Runtime on CPU)


def model_config_pb2() -> Any:
    """Triton's model-config protobuf module (from tritonclient[grpc])."""
    try:
        from tritonclient.grpc import model_config_pb2 as module
    except ImportError as exc:
        raise ModelError(f"Triton's client library is missing ({exc}): pip install 'swapcast[triton]'") from None
    return module


def build_config(
    name: str, signature: Signature, batching: BatchingSpec, serving: ServingSpec, *, max_batch_cap: int | None = None
) -> Any:
    """The ModelConfig message of one model. A model whose batch dimension is fixed is served unbatched
    (max_batch_size 0, full shapes); `max_batch_cap` is the largest batch a TensorRT plan accepts."""
    pb = model_config_pb2()
    config = pb.ModelConfig(name=name)
    if serving.platform == "python":
        config.backend = "python"
    elif serving.platform == "onnxruntime":
        config.platform = "onnxruntime_onnx"
    else:
        config.platform = "tensorrt_plan"
    config.default_model_filename = MODEL_FILES[serving.platform]
    max_batch = min(batching.max_batch, max_batch_cap) if max_batch_cap else batching.max_batch
    batched = signature.batch_dynamic and max_batch >= 1
    config.max_batch_size = max_batch if batched else 0
    for spec in signature.inputs:
        config.input.append(_tensor(pb.ModelInput, pb, spec, batched))
    for spec in signature.outputs:
        config.output.append(_tensor(pb.ModelOutput, pb, spec, batched))
    if batched:
        bounded = BatchingSpec(max_batch, batching.max_queue_delay_ms, batching.deadline_ms, batching.max_queue)
        dynamic = config.dynamic_batching
        dynamic.preferred_batch_size.extend(bounded.preferred_sizes())
        dynamic.max_queue_delay_microseconds = round(batching.max_queue_delay_ms * 1000)
        policy = dynamic.default_queue_policy
        policy.timeout_action = pb.ModelQueuePolicy.REJECT
        policy.default_timeout_microseconds = round((batching.deadline_ms or 0) * 1000)
        policy.allow_timeout_override = True
        policy.max_queue_size = batching.max_queue
    group = config.instance_group.add()
    group.count = serving.instances
    group.kind = pb.ModelInstanceGroup.KIND_GPU if serving.instance_kind == "gpu" else pb.ModelInstanceGroup.KIND_CPU
    if serving.platform == "python":
        config.parameters["threads"].string_value = str(serving.threads)
    elif serving.platform == "onnxruntime" and serving.instance_kind == "cpu":
        config.parameters["intra_op_thread_count"].string_value = str(serving.threads)
    return config


def _tensor(kind: Any, pb: Any, spec: TensorSpec, batched: bool) -> Any:
    dims = list(spec.dims) if batched else [spec.leading, *spec.dims]
    return kind(name=spec.name, data_type=pb.DataType.Value(spec.data_type), dims=dims)


def config_text(config: Any) -> str:
    from google.protobuf import text_format

    text: str = text_format.MessageToString(config)
    return text


def parse_config(text: str) -> Any:
    """Parse a `config.pbtxt` against Triton's schema; a ModelError names what is wrong."""
    from google.protobuf import text_format

    pb = model_config_pb2()
    try:
        return text_format.Parse(text, pb.ModelConfig())
    except text_format.ParseError as exc:
        raise ModelError(f"invalid Triton model config: {exc}") from None
