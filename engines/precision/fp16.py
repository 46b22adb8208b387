"""FP16 variants of ONNX models, with the overflow-prone parts kept in FP32.

The conversion itself is onnxconverter-common's `convert_float_to_float16`. Around it:

* `keep_io_types` (default on): graph inputs and outputs stay FP32, so callers feed and read the same
  arrays as for the FP32 model. onnxconverter-common 1.16 leaves an output FP16 when the node that
  produces it is on the block list (Real-ESRGAN's trailing Resize, a blocked Softmax); such outputs are
  cast back here.
* An op block list: onnxconverter-common's default list (which keeps Resize, whose `scales` input must
  stay FP32, and Range, TopK, NonMaxSuppression...) plus whatever the caller adds.
* A node block list measured on sample inputs (`overflow_nodes`): the FP32 model is run with every
  intermediate tensor exposed, and nodes whose outputs leave FP16's range (with headroom), the nodes
  that consume such tensors, and normalisation-type nodes (InstanceNormalization, LayerNormalization,
  ReduceSumSquare, ReduceL2, Pow...) whose inputs are large enough for their squares to overflow stay in
  FP32. On the networks shipped here nothing is that large (largest activation: 331 in Real-ESRGAN
  animevideov3, 22 in the reference swapper, whose InstanceNormalization inputs stay below 22), so the
  measured list is empty for them; it is there for models whose activations are not known in advance.

The result is written atomically, checked with onnx.checker and loaded once in ONNX Runtime.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from engines.atomic import atomic_path
from engines.errors import ModelError
from engines.onnx_io import check_loads, first_line, load_onnx

log = logging.getLogger(__name__)

FP16_MAX = 65504.0
# A tensor counts as overflow-prone when FP32 values reach this fraction of FP16's largest finite value.
OUTPUT_HEADROOM = 0.5
# Ops that square their input inside (variance, sum of squares, norms): prone from |x| of about sqrt(FP16_MAX).
SQUARING_OPS = frozenset(
    {
        "InstanceNormalization",
        "LayerNormalization",
        "GroupNormalization",
        "BatchNormalization",
        "ReduceSumSquare",
        "ReduceL2",
        "LpNormalization",
        "Pow",
    }
)
SQUARING_INPUT_LIMIT = 256.0


def default_op_block_list() -> list[str]:
    """onnxconverter-common's default list: ops with no FP16 kernel or FP32-only inputs (Resize's scales)."""
    from onnxconverter_common import float16

    return list(float16.DEFAULT_OP_BLOCK_LIST)


@dataclass(frozen=True, slots=True)
class Fp16Conversion:
    path: Path
    blocked_ops: tuple[str, ...]
    blocked_nodes: tuple[str, ...]  # nodes kept in FP32 because of measured ranges, plus any given
    keep_io_types: bool


def tensor_ranges(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Largest |value| of every float tensor a node produces, FP32, on `feeds` (ONNX Runtime, CPU)."""
    import onnxruntime as ort

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    declared = {o.name for o in probe.graph.output}
    produced = [name for node in probe.graph.node for name in node.output if name]
    for name in produced:
        if name not in declared:
            probe.graph.output.append(helper.make_empty_tensor_value_info(name))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # No fusions: every tensor of the graph as written must still exist to be read back.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    with tempfile.TemporaryDirectory(prefix="swapcast-fp16-") as tmp:
        probe_path = Path(tmp) / "probe.onnx"
        onnx.save_model(probe, str(probe_path))
        session = ort.InferenceSession(str(probe_path), options, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        values = session.run(names, {k: np.ascontiguousarray(v) for k, v in feeds.items()})
    ranges = {}
    for name, value in zip(names, values, strict=True):
        array = np.asarray(value)
        if array.dtype.kind == "f" and array.size:
            ranges[name] = float(np.max(np.abs(array.astype(np.float64))))
    for name, array in feeds.items():
        if np.asarray(array).dtype.kind == "f" and np.asarray(array).size:
            ranges[name] = float(np.max(np.abs(np.asarray(array, np.float64))))
    return ranges


def overflow_nodes(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[str]:
    """Names of the nodes that must stay FP32 for `feeds` not to overflow in FP16 (see the module notes)."""
    ranges = tensor_ranges(model, feeds)
    limit = FP16_MAX * OUTPUT_HEADROOM
    hot = {name for name, peak in ranges.items() if peak > limit or not np.isfinite(peak)}
    blocked = []
    for node in model.graph.node:
        big_output = any(name in hot for name in node.output)
        big_input = any(name in hot for name in node.input)
        squares = node.op_type in SQUARING_OPS and any(
            ranges.get(name, 0.0) > SQUARING_INPUT_LIMIT for name in node.input
        )
        if big_output or big_input or squares:
            blocked.append(node.name)
    return blocked


def _name_nodes(model: onnx.ModelProto) -> None:
    """Give every unnamed node a unique name: the node block list works by name."""
    taken = {node.name for node in model.graph.node if node.name}
    for index, node in enumerate(model.graph.node):
        if not node.name:
            candidate = f"{node.op_type}_{index}"
            while candidate in taken:
                candidate += "_"
            node.name = candidate
            taken.add(candidate)


def _restore_float_io(model: onnx.ModelProto, original: onnx.ModelProto) -> None:
    """Cast back any graph output that the FP32 model declares FLOAT and the conversion left FLOAT16."""
    was_float = {o.name for o in original.graph.output if o.type.tensor_type.elem_type == TensorProto.FLOAT}
    producers = {name: node for node in model.graph.node for name in node.output}
    for output in model.graph.output:
        tensor_type = output.type.tensor_type
        if output.name not in was_float or tensor_type.elem_type != TensorProto.FLOAT16:
            continue
        producer = producers.get(output.name)
        half_name = f"{output.name}_fp16"
        if producer is None:
            raise ModelError(f"FP16 conversion left output {output.name!r} FP16 with no node producing it")
        producer.output[list(producer.output).index(output.name)] = half_name
        for node in model.graph.node:  # other readers of the output now read the FP16 tensor
            if node is not producer:
                for i, name in enumerate(node.input):
                    if name == output.name:
                        node.input[i] = half_name
        model.graph.node.append(
            helper.make_node("Cast", [half_name], [output.name], name=f"{output.name}_to_fp32", to=TensorProto.FLOAT)
        )
        tensor_type.elem_type = TensorProto.FLOAT
    for graph_input in model.graph.input:
        if graph_input.type.tensor_type.elem_type == TensorProto.FLOAT16 and graph_input.name in {
            i.name for i in original.graph.input if i.type.tensor_type.elem_type == TensorProto.FLOAT
        }:
            raise ModelError(f"FP16 conversion changed input {graph_input.name!r} to FP16 despite keep_io_types")


def convert_fp16(
    src: Path,
    dst: Path,
    *,
    keep_io_types: bool = True,
    op_block_list: Iterable[str] | None = None,
    extra_block_ops: Sequence[str] = (),
    node_block_list: Sequence[str] = (),
    range_feeds: Mapping[str, np.ndarray] | None = None,
) -> Fp16Conversion:
    """Write an FP16 copy of `src` to `dst` (atomically) and return what was kept in FP32.

    `op_block_list` replaces the default op list (`default_op_block_list()`); `extra_block_ops` adds to
    it. `range_feeds`, when given, are sample inputs on which `overflow_nodes` measures which nodes must
    stay FP32. Raises ModelError when the converted graph is invalid or ONNX Runtime cannot load it.
    """
    from onnxconverter_common import float16

    src = Path(src)
    dst = Path(dst)
    original = load_onnx(src, f"convert {src} to FP16")
    _name_nodes(original)
    blocked_ops = list(default_op_block_list() if op_block_list is None else op_block_list)
    blocked_ops += [op for op in extra_block_ops if op not in blocked_ops]
    blocked_nodes = list(dict.fromkeys(node_block_list))
    if range_feeds is not None:
        measured = overflow_nodes(original, range_feeds)
        if measured:
            log.info("%s: %d nodes stay FP32 for range: %s", src.name, len(measured), ", ".join(measured[:8]))
        blocked_nodes += [n for n in measured if n not in blocked_nodes]

    model = onnx.ModelProto()
    model.CopyFrom(original)
    try:
        with warnings.catch_warnings(record=True) as clamped:
            # One warning per weight below FP16's 1e-7 floor (moved to +-1e-7): counted, not printed.
            warnings.simplefilter("always", UserWarning)
            converted = float16.convert_float_to_float16(
                model,
                keep_io_types=keep_io_types,
                op_block_list=blocked_ops,
                node_block_list=blocked_nodes or None,
            )
    except Exception as exc:  # the converter raises plain Exceptions and assertion errors
        raise ModelError(f"cannot convert {src.name} to FP16: {exc}") from exc
    tiny = [w for w in clamped if "truncated to 1e-07" in str(w.message) or "truncated to -1e-07" in str(w.message)]
    if tiny:
        log.info("%s: %d tiny weight values moved to +-1e-7 for FP16", src.name, len(tiny))
    for other in [w for w in clamped if w not in tiny][:5]:  # weights beyond FP16's range, and the like
        log.warning("%s: %s", src.name, other.message)
    if keep_io_types:
        _restore_float_io(converted, original)
    converted.producer_name = "swapcast fp16"

    with atomic_path(dst) as tmp:
        onnx.save_model(converted, str(tmp))
        try:
            onnx.checker.check_model(str(tmp))
        except onnx.checker.ValidationError as exc:
            raise ModelError(f"FP16 conversion of {src.name} produced an invalid graph: {first_line(exc)}") from exc
        check_loads(tmp, f"the FP16 conversion of {src.name}")
    return Fp16Conversion(dst, tuple(blocked_ops), tuple(blocked_nodes), keep_io_types)
