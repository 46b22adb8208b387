"""PRelu written as Relu where the installed ONNX Runtime runs PRelu slowly, chosen by measurement.

ONNX Runtime from 1.27 on runs PRelu several times slower on CPU than 1.24-1.26 did (on an AVX2 EPYC, PRelu
took 49-62% of face_mesh_468's kernel time on 1.27-1.32 against 9-15% on 1.24-1.26). With a constant slope s,
PRelu(x) = s·x + (1−s)·Relu(x) exactly, and Relu, Mul and Add are fast on every version; but the rewrite
turns one node into four, and where PRelu is fast it is the slower graph (1.24: 3.5 → 4.3 ms a face mesh).
So the importer times both graphs on the installed runtime and keeps the faster (`with_faster_prelu`), and
records which it kept, with the runtime and the times, in the model's metadata (`PRELU_PROP`).
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable, Mapping

import numpy as np
import onnx
from onnx import helper, numpy_helper

PRELU_PROP = "swapcast.prelu"
# The rewrite is kept only when it is clearly faster: a few percent is within a busy machine's noise, and an
# import should not flip between graphs run to run.
MIN_GAIN = 0.9
# Largest difference allowed between the two graphs' outputs (in the outputs' units: ROI pixels for the
# landmark models); float32 rounding gives 3.1e-5 on face_mesh_468 and 1.1e-5 on iris_landmark.
TOLERANCE = 1e-4
ROUNDS = 15

log = logging.getLogger(__name__)

Feeds = Mapping[str, np.ndarray]


def prelu_as_relu(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy of `model` with every PRelu whose slope is an initializer written as s·x + (1−s)·Relu(x), (1−s)
    folded into a constant; and how many were rewritten (PRelu with a computed slope is left as it is)."""
    out = copy.deepcopy(model)
    graph = out.graph
    initializers = {init.name: init for init in graph.initializer}
    nodes: list[onnx.NodeProto] = []
    rewritten = 0
    for node in graph.node:
        slope = initializers.get(node.input[1]) if node.op_type == "PRelu" and not node.domain else None
        if slope is None:
            nodes.append(node)
            continue
        x, (y,) = node.input[0], node.output
        base = f"{y}__prelu"
        s = numpy_helper.to_array(slope)
        graph.initializer.append(numpy_helper.from_array((1.0 - s).astype(s.dtype), f"{base}_keep"))
        nodes += [
            helper.make_node("Mul", [x, slope.name], [f"{base}_sx"], name=f"{base}_mul_s"),
            helper.make_node("Relu", [x], [f"{base}_relu"], name=f"{base}_relu"),
            helper.make_node("Mul", [f"{base}_relu", f"{base}_keep"], [f"{base}_rest"], name=f"{base}_mul_keep"),
            helper.make_node("Add", [f"{base}_sx", f"{base}_rest"], [y], name=f"{base}_add"),
        ]
        rewritten += 1
    del graph.node[:]
    graph.node.extend(nodes)
    return out, rewritten


def _session(model: onnx.ModelProto) -> Callable[[Feeds], list[np.ndarray]]:
    """One single-threaded CPU session of `model`: the per-core cost is what the choice is about."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(feeds: Feeds) -> list[np.ndarray]:
        return [np.asarray(o) for o in session.run(names, dict(feeds))]

    return run


def time_alternately(runs: Mapping[str, Callable[[], object]], rounds: int = ROUNDS) -> dict[str, float]:
    """Median seconds of each callable, run in turn round by round (after one warm-up each), so a busy
    machine slows all of them alike."""
    for run in runs.values():
        run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(values)) for name, values in times.items()}


def with_faster_prelu(
    model: onnx.ModelProto,
    feeds: Feeds,
    *,
    timer: Callable[[Mapping[str, Callable[[], object]]], dict[str, float]] = time_alternately,
) -> onnx.ModelProto:
    """`model`, or its PRelu-as-Relu rewrite when that runs at most MIN_GAIN of its time on the installed
    ONNX Runtime with `feeds` and its outputs agree with the original's within TOLERANCE; which one, the times
    and the difference are recorded in the metadata."""
    rewritten, count = prelu_as_relu(model)
    if count == 0:
        return model
    import onnxruntime as ort

    original_run, rewritten_run = _session(model), _session(rewritten)
    expected, got = original_run(feeds), rewritten_run(feeds)
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(expected, got, strict=True))
    seconds = timer({"prelu": lambda: original_run(feeds), "relu": lambda: rewritten_run(feeds)})
    # Exact up to float rounding: a larger difference means a graph the rewrite does not understand.
    keep_relu = worst <= TOLERANCE and seconds["relu"] <= MIN_GAIN * seconds["prelu"]
    chosen = rewritten if keep_relu else model
    note = (
        f"{'relu' if keep_relu else 'prelu'}: {count} PRelu nodes; onnxruntime {ort.__version__} at import, one "
        f"thread: PRelu {seconds['prelu'] * 1e3:.2f} ms, as Relu {seconds['relu'] * 1e3:.2f} ms; outputs within "
        f"{worst:.2g}"
    )
    helper.set_model_props(chosen, {**{p.key: p.value for p in chosen.metadata_props}, PRELU_PROP: note})
    log.info("PRelu choice: %s", note)
    return chosen


def prelu_choice(model: onnx.ModelProto) -> str | None:
    """The note `with_faster_prelu` left in a model's metadata, if any."""
    return next((p.value for p in model.metadata_props if p.key == PRELU_PROP), None)
