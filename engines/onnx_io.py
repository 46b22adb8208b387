"""Reading ONNX models and checking them, the same way everywhere in the supply chain: a file that is
missing, not ONNX, or refused by ONNX Runtime is one ModelError line naming the file and what was being done."""

from __future__ import annotations

from pathlib import Path

import onnx

from engines.errors import ModelError

MESSAGE_LIMIT = 300


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (ONNX and ONNX Runtime raise pages), at most 300 characters."""
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= MESSAGE_LIMIT else line[: MESSAGE_LIMIT - 3] + "..."


def load_onnx(path: Path, doing: str, *, load_external_data: bool = True) -> onnx.ModelProto:
    """The model at `path`; a ModelError "cannot <doing>: ..." when it is missing or unreadable.
    `doing` says what the model was loaded for, e.g. f"rewrite {path}"."""
    path = Path(path)
    if not path.is_file():
        raise ModelError(f"cannot {doing}: no such model file")
    try:
        return onnx.load(str(path), load_external_data=load_external_data)
    except Exception as exc:  # protobuf raises several unrelated types on a corrupt file
        raise ModelError(f"cannot {doing}: not a readable ONNX model ({first_line(exc)})") from exc


def fed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The graph inputs a caller feeds (old exporters also list every initializer as an input)."""
    initializers = {init.name for init in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def is_fixed_batch(model: onnx.ModelProto) -> bool:
    """Whether the first fed input's leading dimension is fixed at 1 (the graph runs one item per call)."""
    inputs = fed_inputs(model)
    if not inputs:
        return False
    dims = inputs[0].type.tensor_type.shape.dim
    return bool(dims) and dims[0].HasField("dim_value") and dims[0].dim_value == 1


def file_is_fixed_batch(path: Path) -> bool:
    """`is_fixed_batch` for the model file at `path` (read without external weights)."""
    return is_fixed_batch(load_onnx(path, f"read {path}", load_external_data=False))


def check_loads(path: Path, what: str, *, optimize: bool = True) -> None:
    """Raise ModelError unless ONNX Runtime (CPU) can load the model at `path`; `what` names it in the
    message, e.g. "the FP16 conversion of m.onnx". `optimize=False` loads without graph optimisations, for
    graphs ORT's fusions do not take (QDQ with FP16 scales: its QLinear fusions want FP32 scales)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises several unrelated types for graphs it refuses
        raise ModelError(f"ONNX Runtime cannot load {what}: {first_line(exc)}") from exc
