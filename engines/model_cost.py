"""Parameter and multiply-accumulate counts of an ONNX model, per item at batch 1.

MACs are counted for the layers that dominate the cost of the networks swapcast runs: Conv (grouped
included), ConvTranspose, Gemm and MatMul. Element-wise ops, normalisations and resizes are not counted.
Shapes come from ONNX shape inference with every symbolic batch dimension pinned to 1.

Parameters are the elements of floating-point initializers that some node reads. Initializers no node
reads (inswapper's `emap`, which the host applies outside the graph) are reported as `unused_params`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from onnx import TensorProto

from engines.errors import ModelError

_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
_COUNTED_OPS = ("Conv", "ConvTranspose", "Gemm", "MatMul")
_SMALL_CONSTANT = 64


@dataclass(frozen=True)
class ModelCost:
    """Cost of one item through a model.

    params: elements of float initializers read by at least one node.
    macs: multiply-accumulates of Conv/ConvTranspose/Gemm/MatMul for one item (batch 1).
    unused_params: elements of float initializers no node reads.
    macs_by_op: `macs` split by op type.
    """

    params: int
    macs: int
    unused_params: int = 0
    macs_by_op: Mapping[str, int] = field(default_factory=dict)

    @property
    def gmacs(self) -> float:
        return self.macs / 1e9

    @property
    def mparams(self) -> float:
        return self.params / 1e6

    def __str__(self) -> str:
        text = f"{self.mparams:.2f}M params, {self.gmacs:.2f} GMAC per item"
        if self.unused_params:
            text += f" (+{self.unused_params / 1e6:.2f}M unused)"
        return text


def model_cost(
    path_or_model: Path | str | onnx.ModelProto,
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
) -> ModelCost:
    """Count parameters and per-item MACs of an ONNX model.

    Symbolic leading (batch) dimensions of the graph inputs are set to 1. Any other symbolic dimension
    (a detector's free height and width, say) needs a concrete size in `input_shapes`, keyed by input name;
    a shape given there replaces the input's whole shape.
    """
    model = _load(path_or_model)
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}

    used_names: set[str] = set()
    for node in graph.node:
        used_names.update(name for name in node.input if name)
    params = 0
    unused = 0
    for init in graph.initializer:
        if init.data_type not in _FLOAT_TYPES:
            continue
        size = math.prod(init.dims)
        if init.name in used_names:
            params += size
        else:
            unused += size

    if not any(node.op_type in _COUNTED_OPS for node in graph.node):
        return ModelCost(params=params, macs=0, unused_params=unused, macs_by_op={})

    shapes = _infer_shapes(model, initializers, input_shapes or {})
    by_op: dict[str, int] = {}
    for node in graph.node:
        if node.op_type not in _COUNTED_OPS:
            continue
        macs = _node_macs(node, shapes)
        by_op[node.op_type] = by_op.get(node.op_type, 0) + macs
    return ModelCost(params=params, macs=sum(by_op.values()), unused_params=unused, macs_by_op=by_op)


def _load(path_or_model: Path | str | onnx.ModelProto) -> onnx.ModelProto:
    if isinstance(path_or_model, onnx.ModelProto):
        return path_or_model
    path = Path(path_or_model)
    if not path.is_file():
        raise ModelError(f"cannot measure {path}: no such model file")
    try:
        return onnx.load(str(path))
    except Exception as exc:  # protobuf raises several unrelated types on a corrupt file
        raise ModelError(f"cannot measure {path}: not a readable ONNX model ({exc})") from exc


def _infer_shapes(
    model: onnx.ModelProto,
    initializers: Mapping[str, TensorProto],
    input_shapes: Mapping[str, Sequence[int]],
) -> dict[str, tuple[int, ...]]:
    """Shapes of every tensor the graph names, with batch 1 and the caller's overrides."""
    # Copy only the graph skeleton: shape inference needs initializer shapes, not their (large) data.
    skeleton = onnx.ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    skeleton.graph.name = model.graph.name
    skeleton.graph.node.extend(model.graph.node)
    skeleton.graph.input.extend(model.graph.input)
    skeleton.graph.output.extend(model.graph.output)
    declared = {inp.name for inp in skeleton.graph.input}
    for init in initializers.values():
        if init.name in declared:
            continue
        if math.prod(init.dims) <= _SMALL_CONSTANT:
            # Shapes, pads, axes and scales keep their values so inference can propagate through them.
            skeleton.graph.initializer.append(init)
        else:
            stub = onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims))
            skeleton.graph.input.append(stub)

    for graph_input in skeleton.graph.input:
        if graph_input.name in initializers:
            continue
        dims = graph_input.type.tensor_type.shape.dim
        if graph_input.name in input_shapes:
            wanted = list(input_shapes[graph_input.name])
            del dims[:]
            for size in wanted:
                dims.add().dim_value = int(size)
            continue
        for index, dim in enumerate(dims):
            if dim.HasField("dim_value") and dim.dim_value > 0:
                continue
            if index == 0:
                dim.Clear()
                dim.dim_value = 1
            else:
                raise ModelError(
                    f"cannot measure the model: input {graph_input.name!r} has a free dimension {index}; "
                    "pass its size in input_shapes"
                )
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=True, data_prop=True)
    except Exception as exc:
        raise ModelError(f"cannot measure the model: ONNX shape inference failed ({exc})") from exc

    # Initializers' shapes are known from their dims; inference reports none for the small ones kept as
    # constants above (a conv weight of 64 elements or fewer, say).
    shapes: dict[str, tuple[int, ...]] = {init.name: tuple(int(d) for d in init.dims) for init in initializers.values()}
    values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    for value in values:
        tensor_type = value.type.tensor_type
        if not tensor_type.HasField("shape"):
            continue
        dims_out = tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims_out):
            shapes[value.name] = tuple(int(d.dim_value) for d in dims_out)
    return shapes


def _shape(shapes: Mapping[str, tuple[int, ...]], name: str, node: onnx.NodeProto) -> tuple[int, ...]:
    if name not in shapes:
        raise ModelError(
            f"cannot measure the model: the shape of {name!r} (read by {node.op_type} node {node.name!r}) "
            "is unknown after shape inference"
        )
    return shapes[name]


def _attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def _node_macs(node: onnx.NodeProto, shapes: Mapping[str, tuple[int, ...]]) -> int:
    op = node.op_type
    if op == "Conv":
        weight = _shape(shapes, node.input[1], node)
        out = _shape(shapes, node.output[0], node)
        # Each output element needs (C_in / groups) * prod(kernel) MACs; weight is [C_out, C_in/g, k...].
        return math.prod(out) * math.prod(weight[1:])
    if op == "ConvTranspose":
        weight = _shape(shapes, node.input[1], node)
        inp = _shape(shapes, node.input[0], node)
        # Each input element is scattered into (C_out / groups) * prod(kernel) outputs;
        # weight is [C_in, C_out/g, k...].
        return math.prod(inp) * math.prod(weight[1:])
    if op == "Gemm":
        a = _shape(shapes, node.input[0], node)
        b = _shape(shapes, node.input[1], node)
        m, k = (a[1], a[0]) if _attr_int(node, "transA", 0) else (a[0], a[1])
        n = b[0] if _attr_int(node, "transB", 0) else b[1]
        return m * k * n
    if op == "MatMul":
        a = _shape(shapes, node.input[0], node)
        out = _shape(shapes, node.output[0], node)
        return math.prod(out) * a[-1]
    raise AssertionError(op)
