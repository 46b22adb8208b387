"""Fold a graph's shape arithmetic into constants for one set of input shapes.

Exported models compute Reshape targets, Resize sizes and Pad amounts from their input at run time
(`Shape -> Gather -> Unsqueeze -> Concat -> Resize`). Runtimes that read those small tensors on the host
(onnx2torch's converters call `.tolist()` / `torch.Size(tensor)` on them) synchronise with the GPU on
every call, and a CUDA graph cannot be captured over such a read at all. Once every input shape is
known, all of that arithmetic has one answer: `static_shapes` fixes the input shapes, replaces `Shape`
and `Size` by constants from shape inference, evaluates every node whose inputs are all constant with
ONNX's reference evaluator, and drops what became dead. `host_shape_inputs` lists what still depends on
run-time data, so a caller can tell a capturable graph from one that is not.

Only nodes from `FOLDABLE` are evaluated (shape arithmetic, never convolutions or other weight maths):
a fold never grows the file by more than those small tensors. (onnx-simplifier is not a dependency, and
ONNX Runtime's constant folding comes with its other graph rewrites, which the torch conversion should
not see.)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from engines.errors import ModelError

# Shape arithmetic: evaluated when all inputs are constant.
FOLDABLE = frozenset(
    {
        "Cast",
        "Ceil",
        "Concat",
        "ConstantOfShape",
        "Div",
        "Equal",
        "Floor",
        "Gather",
        "Identity",
        "Max",
        "Min",
        "Mul",
        "Add",
        "Sub",
        "Range",
        "Reshape",
        "Slice",
        "Squeeze",
        "Unsqueeze",
        "Where",
        "Not",
        "Less",
        "Greater",
        "Abs",
        "Neg",
        "Sqrt",
    }
)
FOLD_MAX_ELEMENTS = 4096  # shape tensors are tiny; never fold a weight-sized result
MAX_PASSES = 8  # folds that open up further folds (RetinaFace at batch 1 needs three passes)

# Inputs a host-reading runtime needs as constants (op type -> input positions); `Shape`/`Size` read the
# shape of their input, which is static only after folding.
HOST_SHAPE_INPUTS: Mapping[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "Pad": (1, 2, 3),
    "Split": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "ConstantOfShape": (0,),
    "Slice": (1, 2, 3, 4),
    "Squeeze": (1,),
    "Unsqueeze": (1,),
    "Range": (0, 1, 2),
    "TopK": (1,),
}
DATA_DEPENDENT = frozenset({"Shape", "Size", "NonZero", "NonMaxSuppression", "Loop", "If", "Scan"})


def _constants(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    shapes: dict[str, list[int]] = {}
    for value in [*model.graph.input, *model.graph.value_info, *model.graph.output]:
        tensor = value.type.tensor_type
        if not tensor.HasField("shape"):
            continue
        dims = tensor.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = [int(d.dim_value) for d in dims]
    return shapes


def _evaluate(node: onnx.NodeProto, inputs: Sequence[np.ndarray], opset: Sequence[onnx.OperatorSetIdProto]) -> list:
    from onnx.reference import ReferenceEvaluator

    names = [f"in{i}" for i in range(len(inputs))]
    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    del copy.input[:]
    copy.input.extend(name if real else "" for name, real in zip(names, node.input, strict=True))
    feeds = {name: value for name, value, real in zip(names, inputs, node.input, strict=True) if real}
    graph = onnx.helper.make_graph(
        [copy],
        "fold",
        [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.UNDEFINED, None) for name in feeds],
        [onnx.helper.make_tensor_value_info(out, onnx.TensorProto.UNDEFINED, None) for out in node.output],
    )
    single = onnx.helper.make_model(graph, opset_imports=list(opset))
    return list(ReferenceEvaluator(single).run(None, feeds))


def static_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """A copy of `model` with the given input shapes fixed and its shape arithmetic folded into constants.

    Folding repeats until a pass folds nothing more: shape inference leaves some shapes open until an
    earlier fold has made their inputs constant (a Resize whose sizes were computed has an unknown output
    until then, and a batch of 1 broadcast against an unknown dimension stays unknown, where 2 would not).
    ModelError when an input is missing from `input_shapes`.
    """
    folded = _fold(model, input_shapes)
    for _ in range(MAX_PASSES - 1):
        again = _fold(folded, input_shapes)
        if len(again.graph.node) == len(folded.graph.node):
            return again
        folded = again
    return folded


def _fold(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> onnx.ModelProto:
    """One pass of `static_shapes`: input shapes fixed, shapes inferred, what is constant evaluated."""
    folded = onnx.ModelProto()
    folded.CopyFrom(model)
    graph = folded.graph
    initializers = {init.name for init in graph.initializer}
    for value in graph.input:
        if value.name in initializers:
            continue
        if value.name not in input_shapes:
            raise ModelError(f"no shape given for input {value.name!r}")
        wanted = list(input_shapes[value.name])
        dims = value.type.tensor_type.shape.dim
        if len(dims) != len(wanted):
            raise ModelError(f"input {value.name!r} has rank {len(dims)}, shape {wanted} given")
        for dim, size in zip(dims, wanted, strict=True):
            dim.Clear()
            dim.dim_value = int(size)
    del graph.value_info[:]
    for out in graph.output:  # re-inferred below
        out.type.tensor_type.ClearField("shape")
    folded = shape_inference.infer_shapes(folded, strict_mode=True, data_prop=True)
    graph = folded.graph

    constants = _constants(folded)
    shapes = _static_shapes(folded)
    outputs = {o.name for o in graph.output}
    kept: list[onnx.NodeProto] = []
    for node in graph.node:
        result: list | None = None
        if node.op_type == "Constant" and node.output[0] in constants:
            result = None
        elif node.op_type in ("Shape", "Size") and node.input[0] in shapes:
            shape = np.array(shapes[node.input[0]], dtype=np.int64)
            if node.op_type == "Size":
                result = [np.array(int(np.prod(shape)), dtype=np.int64)]
            else:
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                result = [shape[attrs.get("start", 0) : attrs.get("end", len(shape))]]
        elif node.op_type in FOLDABLE and all(not name or name in constants for name in node.input):
            inputs = [constants[name] if name else np.array([]) for name in node.input]
            result = _evaluate(node, inputs, folded.opset_import)
            if any(np.asarray(r).size > FOLD_MAX_ELEMENTS for r in result):
                result = None
        if result is None:
            kept.append(node)
            continue
        for name, value in zip(node.output, result, strict=True):
            constants[name] = np.asarray(value)
            if name in outputs:
                kept.append(onnx.helper.make_node("Constant", [], [name], value=numpy_helper.from_array(value)))
    del graph.node[:]
    graph.node.extend(kept)

    # Every constant a kept node reads becomes an initializer; Constant nodes and dead values go away.
    used = {name for node in graph.node for name in node.input} | outputs
    original = {init.name for init in model.graph.initializer}
    present = {init.name for init in graph.initializer}
    for name in sorted(used):
        if name in constants and name not in present:
            graph.initializer.append(numpy_helper.from_array(np.asarray(constants[name]), name))
    live = [n for n in graph.node if not (n.op_type == "Constant" and n.output[0] not in outputs)]
    del graph.node[:]
    graph.node.extend(live)
    needed = {name for node in graph.node for name in node.input}
    unused = [init for init in graph.initializer if init.name not in needed | outputs | original]
    for init in unused:
        graph.initializer.remove(init)
    del graph.value_info[:]
    return shape_inference.infer_shapes(folded, strict_mode=True)


def host_shape_inputs(model: onnx.ModelProto) -> list[str]:
    """What a host-reading runtime would have to read from the device on every call: data-dependent ops,
    and shape inputs (Reshape targets, Resize sizes, ...) that are not constants. Empty: capturable."""
    constants = _constants(model)
    found = []
    for node in model.graph.node:
        if node.op_type in DATA_DEPENDENT:
            found.append(f"{node.op_type} {node.name or node.output[0]}")
            continue
        for position in HOST_SHAPE_INPUTS.get(node.op_type, ()):
            if position < len(node.input) and node.input[position] and node.input[position] not in constants:
                found.append(f"{node.op_type} {node.name or node.output[0]} input {position}")
    return found
