"""Turn a fixed-batch-1 ONNX model into one that takes any batch, and prove the rewrite is sound.

Most exported face models fix the batch at 1. Running several faces in one call needs the leading
dimension of the inputs and outputs to be symbolic, and any Reshape whose target shape hard-codes that
leading 1 to copy it from its input instead. Some graphs cannot be batched by such a rewrite at all
(they flatten the whole tensor, or mix items); `make_batch_dynamic` finds that out by running the
rewritten model on a batch and comparing each item with the original model run on that item alone,
and says so with a `ModelError` so the caller can keep running items one at a time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from engines.atomic import atomic_path
from engines.errors import ModelError
from engines.model_files import ModelFiles
from engines.onnx_io import fed_inputs, file_is_fixed_batch, first_line, load_onnx

BATCH_DIM = "batch"
VERIFY_BATCH = 3
VERIFY_ATOL = 1e-5
_SMALL_CONSTANT = 64

log = logging.getLogger(__name__)


def save_model_atomic(model: onnx.ModelProto, path: Path) -> Path:
    """Write `model` to `path` through a temporary file in the same folder, then rename it into place."""
    with atomic_path(path) as tmp:
        onnx.save_model(model, str(tmp))
    return Path(path)


def rewrite_if_fixed_batch(files: ModelFiles) -> Path:
    """The FP32 file to run `files.model` batched from: the model itself when its batch is free; for a graph
    saved with a fixed batch of 1 (the real inswapper), its batch-dynamic rewrite, made and verified once and
    cached at `files.dynamic`. A graph that cannot be rewritten runs from the model itself, item by item, and
    the log says so."""
    if files.dynamic.is_file():
        return files.dynamic
    if not file_is_fixed_batch(files.model):
        return files.model
    try:
        return make_batch_dynamic(files.model, files.dynamic)
    except ModelError as exc:
        log.warning("%s keeps its fixed batch of 1 (%s): items run one by one", files.model.name, exc)
        return files.model


def make_batch_dynamic(
    src: Path,
    dst: Path,
    *,
    verify_inputs: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Rewrite `src` (batch fixed at 1) so its batch dimension is the symbol `batch`; write it to `dst`.

    The leading dimension of every graph input and output becomes `batch`; Reshape target shapes given
    as constants whose leading entry is 1, applied to a tensor whose leading dimension is the batch, are
    changed to copy that dimension (0, or -1 for `allowzero` Reshapes). value_info is re-inferred.
    Initializers keep their order (a model whose last initializer carries meaning, like inswapper's
    `emap`, keeps it last).

    The result is checked with onnx.checker and strict shape inference, then run in onnxruntime on a
    batch: `verify_inputs` maps every graph input to an array whose leading dimension is the batch
    (at least 2); without it, a batch of 3 is drawn with a fixed seed (rank-4 float inputs uniform in
    [0, 1), rank-2 float inputs as L2-normalised rows, other floats standard normal). Each item of the
    batched result must match the ORIGINAL model run on that item alone within 1e-5.

    Raises ModelError when the graph cannot be made dynamic this way; `dst` is then left untouched.
    """
    src = Path(src)
    dst = Path(dst)
    model = load_onnx(src, f"rewrite {src}")
    graph = model.graph
    init_names = {init.name for init in graph.initializer}
    feed_inputs = fed_inputs(model)
    had_value_info = len(graph.value_info) > 0

    for value in feed_inputs:
        _set_batch_dim(value, src)
    for value in graph.output:
        if value.type.tensor_type.HasField("shape"):  # an output without a declared shape stays so
            _set_batch_dim(value, src)
    del graph.value_info[:]

    for _ in range(len(graph.node) + 1):
        shapes = _infer_skeleton(model, src, strict=False)
        if not _fix_reshapes(model, _batch_tensors(shapes)):
            break

    final_shapes = _infer_skeleton(model, src, strict=True)
    for output in graph.output:
        leading = _leading_dim(final_shapes.get(output.name))
        if isinstance(leading, int):
            raise _cannot(src, f"output {output.name!r} keeps a fixed leading dimension of {leading}")
    if had_value_info:
        named = {v.name for v in graph.input} | {v.name for v in graph.output} | init_names
        graph.value_info.extend(value for name, value in final_shapes.items() if name not in named)

    with atomic_path(dst) as tmp:
        onnx.save_model(model, str(tmp))
        try:
            onnx.checker.check_model(str(tmp), full_check=False)
        except onnx.checker.ValidationError as exc:
            raise _cannot(src, f"the rewritten graph is invalid: {first_line(exc)}") from exc
        _verify(src, tmp, feed_inputs, verify_inputs)
    return dst


def _cannot(src: Path, reason: str) -> ModelError:
    return ModelError(f"{src.name}: the graph cannot be made batch-dynamic ({reason}); run items one at a time")


def _set_batch_dim(value: onnx.ValueInfoProto, src: Path) -> None:
    tensor_type = value.type.tensor_type
    dims = tensor_type.shape.dim
    if not tensor_type.HasField("shape") or len(dims) == 0:
        raise _cannot(src, f"{value.name!r} has no batch dimension")
    first = dims[0]
    if first.HasField("dim_value") and first.dim_value != 1:
        raise _cannot(src, f"{value.name!r} has a fixed leading dimension of {first.dim_value}, not 1")
    first.Clear()
    first.dim_param = BATCH_DIM


def _infer_skeleton(model: onnx.ModelProto, src: Path, *, strict: bool) -> dict[str, onnx.ValueInfoProto]:
    """Shape-infer the graph without copying initializer data; returns every named tensor's value info."""
    skeleton = onnx.ModelProto(ir_version=model.ir_version)
    skeleton.opset_import.extend(model.opset_import)
    skeleton.functions.extend(model.functions)
    graph = model.graph
    skeleton.graph.name = graph.name
    skeleton.graph.node.extend(graph.node)
    skeleton.graph.input.extend(graph.input)
    skeleton.graph.output.extend(graph.output)
    declared = {inp.name for inp in graph.input}
    for init in graph.initializer:
        if init.name in declared:
            continue
        if math.prod(init.dims) <= _SMALL_CONSTANT:
            # Small constants (shapes, axes, pads, scales) keep their values so that shape inference
            # can propagate through Reshape, Pad, Resize and friends.
            skeleton.graph.initializer.append(init)
        else:
            skeleton.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type, list(init.dims)))
    try:
        inferred = onnx.shape_inference.infer_shapes(skeleton, strict_mode=strict, data_prop=True)
    except Exception as exc:
        raise _cannot(src, f"shape inference failed: {first_line(exc)}") from exc
    values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
    return {value.name: value for value in values}


def _leading_dim(value: onnx.ValueInfoProto | None) -> str | int | None:
    if value is None or not value.type.tensor_type.HasField("shape"):
        return None
    dims = value.type.tensor_type.shape.dim
    if not dims:
        return None
    first = dims[0]
    if first.HasField("dim_value"):
        return int(first.dim_value)
    if first.HasField("dim_param"):
        return str(first.dim_param)
    return None


def _batch_tensors(shapes: Mapping[str, onnx.ValueInfoProto]) -> set[str]:
    return {name for name, value in shapes.items() if _leading_dim(value) == BATCH_DIM}


def _constant_shape(model: onnx.ModelProto, name: str) -> tuple[np.ndarray, str, int] | None:
    """The value of a constant shape tensor and where it lives: ("init", index) or ("node", index)."""
    for index, init in enumerate(model.graph.initializer):
        if init.name == name:
            return numpy_helper.to_array(init).copy(), "init", index
    for index, node in enumerate(model.graph.node):
        if node.op_type == "Constant" and name in node.output:
            for attr in node.attribute:
                if attr.name == "value":
                    return numpy_helper.to_array(attr.t).copy(), "node", index
                if attr.name == "value_ints":
                    return np.asarray(list(attr.ints), dtype=np.int64), "node", index
    return None


def _fix_reshapes(model: onnx.ModelProto, batch_tensors: set[str]) -> bool:
    """Make Reshapes of batch-led tensors copy the batch instead of hard-coding 1. True if any changed."""
    graph = model.graph
    consumers: dict[str, list[int]] = {}
    for index, node in enumerate(graph.node):
        for name in node.input:
            consumers.setdefault(name, []).append(index)

    # shape constant name -> (new value, indices of Reshape nodes that want it)
    wanted: dict[str, list[tuple[int, np.ndarray]]] = {}
    constants: dict[str, tuple[np.ndarray, str, int]] = {}
    for index, node in enumerate(graph.node):
        if node.op_type != "Reshape" or len(node.input) < 2 or node.input[0] not in batch_tensors:
            continue
        shape_name = node.input[1]
        found = constants.get(shape_name) or _constant_shape(model, shape_name)
        if found is None:
            continue
        constants[shape_name] = found
        value = found[0]
        if value.ndim != 1 or value.size == 0 or int(value[0]) != 1:
            continue
        allowzero = any(attr.name == "allowzero" and attr.i == 1 for attr in node.attribute)
        new_value = value.astype(np.int64)
        if not allowzero:
            new_value[0] = 0
        elif -1 not in value.tolist():
            new_value[0] = -1
        else:
            continue
        wanted.setdefault(shape_name, []).append((index, new_value))

    if not wanted:
        return False

    inits = list(graph.initializer)
    nodes = list(graph.node)
    taken = {init.name for init in inits} | {out for node in nodes for out in node.output}
    new_nodes_before: dict[int, list[onnx.NodeProto]] = {}
    new_inits_before: dict[int, list[TensorProto]] = {}
    for shape_name, requests in wanted.items():
        _, where, position = constants[shape_name]
        users = consumers.get(shape_name, [])
        all_agree = len({tuple(v.tolist()) for _, v in requests}) == 1
        if (
            all_agree
            and sorted(i for i, _ in requests) == sorted(users)
            and shape_name not in {out.name for out in graph.output}
        ):
            new_value = requests[0][1]
            tensor = numpy_helper.from_array(new_value, shape_name)
            if where == "init":
                inits[position] = tensor
            else:
                nodes[position] = onnx.helper.make_node(
                    "Constant", [], [shape_name], name=nodes[position].name, value=tensor
                )
            continue
        for node_index, new_value in requests:
            new_name = _unique(f"{shape_name}_batch", taken)
            tensor = numpy_helper.from_array(new_value, new_name)
            if where == "init":
                # Inserted just before the original so every existing initializer keeps its place
                # relative to the end of the list.
                new_inits_before.setdefault(position, []).append(tensor)
            else:
                constant = onnx.helper.make_node("Constant", [], [new_name], name=new_name, value=tensor)
                new_nodes_before.setdefault(node_index, []).append(constant)
            reshape = nodes[node_index]
            reshape.input[1] = new_name

    del graph.initializer[:]
    for index, init in enumerate(inits):
        graph.initializer.extend(new_inits_before.get(index, []))
        graph.initializer.append(init)
    del graph.node[:]
    for index, node in enumerate(nodes):
        graph.node.extend(new_nodes_before.get(index, []))
        graph.node.append(node)
    return True


def _unique(base: str, taken: set[str]) -> str:
    name = base
    counter = 1
    while name in taken:
        counter += 1
        name = f"{base}{counter}"
    taken.add(name)
    return name


_NP_TYPES: dict[int, type[np.generic]] = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.DOUBLE: np.float64,
    TensorProto.INT64: np.int64,
    TensorProto.INT32: np.int32,
    TensorProto.UINT8: np.uint8,
    TensorProto.INT8: np.int8,
    TensorProto.BOOL: np.bool_,
}


def _random_inputs(inputs: list[onnx.ValueInfoProto], src: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20240917)
    feeds: dict[str, np.ndarray] = {}
    for value in inputs:
        tensor_type = value.type.tensor_type
        dtype = _NP_TYPES.get(tensor_type.elem_type)
        if dtype is None:
            raise _cannot(src, f"input {value.name!r} has an element type the check cannot draw")
        shape = [VERIFY_BATCH]
        for dim in list(tensor_type.shape.dim)[1:]:
            if not dim.HasField("dim_value"):
                raise _cannot(src, f"input {value.name!r} has a free dimension; pass verify_inputs")
            shape.append(int(dim.dim_value))
        if np.issubdtype(dtype, np.floating):
            if len(shape) == 4:
                data = rng.random(shape)
            elif len(shape) == 2:
                data = rng.standard_normal(shape)
                data /= np.linalg.norm(data, axis=1, keepdims=True)
            else:
                data = rng.standard_normal(shape)
            feeds[value.name] = data.astype(dtype)
        elif dtype is np.bool_:
            feeds[value.name] = rng.random(shape) < 0.5
        else:
            feeds[value.name] = rng.integers(0, 2, size=shape).astype(dtype)
    return feeds


def _verify(
    src: Path,
    candidate: Path,
    inputs: list[onnx.ValueInfoProto],
    verify_inputs: Mapping[str, np.ndarray] | None,
) -> None:
    import onnxruntime as ort

    if verify_inputs is None:
        feeds = _random_inputs(inputs, src)
    else:
        names = {value.name for value in inputs}
        if set(verify_inputs) != names:
            raise ValueError(f"verify_inputs must give exactly the inputs {sorted(names)}")
        feeds = {name: np.asarray(array) for name, array in verify_inputs.items()}
        batch_sizes = {array.shape[0] if array.ndim else 0 for array in feeds.values()}
        if len(batch_sizes) != 1 or min(batch_sizes) < 2:
            raise ValueError("verify_inputs arrays must share one leading batch dimension of at least 2")
    batch = next(iter(feeds.values())).shape[0]

    options = ort.SessionOptions()
    options.log_severity_level = 4  # failures surface as exceptions, reported in the ModelError
    providers = ["CPUExecutionProvider"]
    try:
        original = ort.InferenceSession(str(src), options, providers=providers)
    except Exception as exc:
        raise ModelError(f"{src.name}: onnxruntime cannot load the original model ({first_line(exc)})") from exc
    try:
        rewritten = ort.InferenceSession(str(candidate), options, providers=providers)
        batched = rewritten.run(None, feeds)
    except Exception as exc:
        raise _cannot(src, f"onnxruntime failed on a batch of {batch}: {first_line(exc)}") from exc
    output_names = [out.name for out in rewritten.get_outputs()]

    for item in range(batch):
        single = original.run(None, {name: array[item : item + 1] for name, array in feeds.items()})
        for name, alone, together in zip(output_names, single, batched, strict=True):
            part = np.asarray(together)[item : item + 1]
            alone = np.asarray(alone)
            if part.shape != alone.shape:
                raise _cannot(
                    src, f"output {name!r} of item {item} has shape {part.shape} batched, {alone.shape} alone"
                )
            if part.dtype.kind in "fc":
                diff = float(np.max(np.abs(part.astype(np.float64) - alone.astype(np.float64)), initial=0.0))
                ok = diff <= VERIFY_ATOL
            else:
                diff = float(np.count_nonzero(part != alone))
                ok = diff == 0
            if not ok:
                raise _cannot(
                    src, f"output {name!r} of item {item} differs from running it alone (max diff {diff:.3g})"
                )
