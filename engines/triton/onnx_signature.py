"""The inputs and outputs of an ONNX model as Triton sees them: names, data types, and dims without the batch."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto

from engines.errors import ModelError

# ONNX element types Triton has a data type for (model_config.proto DataType).
TRITON_TYPES: dict[int, str] = {
    TensorProto.BOOL: "TYPE_BOOL",
    TensorProto.UINT8: "TYPE_UINT8",
    TensorProto.UINT16: "TYPE_UINT16",
    TensorProto.UINT32: "TYPE_UINT32",
    TensorProto.UINT64: "TYPE_UINT64",
    TensorProto.INT8: "TYPE_INT8",
    TensorProto.INT16: "TYPE_INT16",
    TensorProto.INT32: "TYPE_INT32",
    TensorProto.INT64: "TYPE_INT64",
    TensorProto.FLOAT16: "TYPE_FP16",
    TensorProto.FLOAT: "TYPE_FP32",
    TensorProto.DOUBLE: "TYPE_FP64",
    TensorProto.BFLOAT16: "TYPE_BF16",
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    data_type: str  # Triton's name, e.g. TYPE_FP32
    dims: tuple[int, ...]  # without the leading batch dimension; -1 where the model takes any size
    leading: int  # the leading dimension itself (-1 when symbolic), for models served unbatched


@dataclass(frozen=True)
class Signature:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    batch_dynamic: bool  # the leading dimension of every input and output is symbolic


def read_signature(path: Path) -> Signature:
    """The model's graph inputs (initializers excluded) and outputs; weights are not loaded."""
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelError(f"cannot read ONNX model {path}: {exc}") from None
    graph = model.graph
    initializers = {init.name for init in graph.initializer}
    inputs = [value for value in graph.input if value.name not in initializers]
    if not inputs or not graph.output:
        raise ModelError(f"ONNX model {path} has no inputs or no outputs")
    specs_in = tuple(_spec(value, path) for value in inputs)
    specs_out = tuple(_spec(value, path) for value in graph.output)
    leading = [_leading_dim(value) for value in (*inputs, *graph.output)]
    return Signature(specs_in, specs_out, batch_dynamic=all(isinstance(dim, str) for dim in leading))


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [dim.dim_param or (dim.dim_value if dim.HasField("dim_value") else "?") for dim in _shape(value).dim]


def _shape(value: onnx.ValueInfoProto) -> onnx.TensorShapeProto:
    return value.type.tensor_type.shape


def _leading_dim(value: onnx.ValueInfoProto) -> int | str | None:
    dims = _dims(value)
    return dims[0] if dims else None


def _spec(value: onnx.ValueInfoProto, path: Path) -> TensorSpec:
    elem = value.type.tensor_type.elem_type
    if elem not in TRITON_TYPES:
        raise ModelError(f"{path}: tensor {value.name!r} has ONNX type {elem}, which Triton cannot serve")
    dims = _dims(value)
    if not dims:
        raise ModelError(f"{path}: tensor {value.name!r} has no shape; Triton needs one")
    fixed = [dim if isinstance(dim, int) and dim > 0 else -1 for dim in dims]
    return TensorSpec(value.name, TRITON_TYPES[elem], tuple(fixed[1:]), fixed[0])
