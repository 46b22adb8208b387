"""CUDA graphs for the torch backend, checked on a CPU where the logic allows.

A capture fails on any host read of a device tensor. A module run on the meta device fails on exactly
those reads (a meta tensor has no data), so `host_reads` finds on a CPU what a capture would trip over:
the plain onnx2torch conversion of every shipped model fails it, the module the runner captures passes
it, and still matches ONNX Runtime. The capture bookkeeping (failures remembered, a bound, metrics) is
driven through a stand-in capture; the real captures run in the GPU test at the end.
"""

import threading
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from onnx2torch import convert

from app.observability import Metrics
from app.runtime.onnx import OnnxModel
from app.runtime.torch_backend import TorchModel, fold_aliases, ieee_fp32
from app.runtime.torch_graphs import SharedExclusiveLock, host_reads
from app.variants import source_for
from engines.onnx_static import host_shape_inputs, static_shapes
from engines.store import ModelStore

SHAPES = {
    "retinaface_mnet025": {"input": (2, 3, 96, 128)},
    "realesr_animevideov3_x2": {"input": (2, 3, 32, 24)},
    "reference_swapper_narrow": {"target": (2, 3, 128, 128), "source": (2, 512)},
}


def runnable(store: ModelStore, name: str) -> Path:
    return source_for(store, name).runnable


def feeds_for(name: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(5)
    return {k: rng.random(v, dtype=np.float32) for k, v in SHAPES[name].items()}


@pytest.mark.parametrize("batch", [1, 2])  # at 1, broadcasting leaves shapes open until an earlier fold
def test_folding_leaves_retinaface_no_shape_arithmetic_and_the_same_outputs(store: ModelStore, batch: int) -> None:
    model = onnx.load(str(store.ensure("retinaface_mnet025")))
    assert any("Shape" in found for found in host_shape_inputs(model))
    shapes = {"input": (batch, *SHAPES["retinaface_mnet025"]["input"][1:])}
    folded = static_shapes(model, shapes)
    ops = {node.op_type for node in folded.graph.node}
    assert host_shape_inputs(folded) == [] and not ops & {"Shape", "Gather", "Unsqueeze", "Cast"}
    rng = np.random.default_rng(5)
    feeds = {"input": rng.random(shapes["input"], dtype=np.float32)}
    import onnxruntime as ort

    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(folded.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(Exception, match="no shape given"):
        static_shapes(model, {})


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_the_captured_module_reads_nothing_back_and_matches_onnxruntime(store: ModelStore, name: str) -> None:
    path = runnable(store, name)
    feeds = feeds_for(name)
    example = [torch.from_numpy(feeds[k]) for k in SHAPES[name]]
    plain_graph = onnx.load(str(path))
    fold_aliases(plain_graph)
    assert host_reads(convert(plain_graph).eval(), example) is not None  # what onnx2torch gives: not capturable

    model = TorchModel(path, device="cpu", threads=2)
    assert model.shapes_from_input == (name == "retinaface_mnet025")
    module = model._static_module(example)
    assert module is not None and host_reads(module, example) is None
    with torch.inference_mode():
        got = model._forward(example, module)
    want = OnnxModel(path, threads=2).run(feeds)
    for a, b in zip(got, want, strict=True):
        assert a.shape == b.shape and float(np.abs(a.numpy() - b).max()) <= 1e-4


def capture_count(model: str, outcome: str) -> float:
    """As a server's /metrics shows it."""
    registry = Metrics().registry
    value = registry.get_sample_value("swapcast_cuda_graph_captures_total", {"model": model, "outcome": outcome})
    return value or 0.0


@pytest.mark.slow
def test_a_failed_capture_is_remembered_and_graphs_are_bounded(
    store: ModelStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = store.ensure("realesr_animevideov3_x2")
    stem = path.stem
    before = {o: capture_count(stem, o) for o in ("failed", "over_limit")}
    for bound in (8, 0):
        model = TorchModel(path, device="cpu", threads=2, max_graphs=bound)
        model.cuda_graphs = True  # drive the bookkeeping on a CPU; the capture itself is a stand-in
        tries: list[tuple[int, ...]] = []

        def failing(tensors: list[torch.Tensor], tries: list[tuple[int, ...]] = tries) -> tuple[str, None]:
            tries.append(tuple(tensors[0].shape))
            return "failed", None

        monkeypatch.setattr(model, "_capture", failing)
        for batch in (2, 2, 2, 3, 3):
            (out,) = model.run({"input": np.zeros((batch, 3, 16, 16), np.float32)})
            assert out.shape == (batch, 3, 32, 32)  # ran eagerly
        # Each shape is tried once and a failure is not retried; over the bound nothing is tried.
        assert tries == ([(2, 3, 16, 16), (3, 3, 16, 16)] if bound else [])
        assert set(model.graph_outcomes.values()) == {"failed" if bound else "over_limit"}
    assert capture_count(stem, "failed") == before["failed"] + 2
    assert capture_count(stem, "over_limit") == before["over_limit"] + 2


def test_fp32_turns_tf32_off() -> None:
    conv, matmul = torch.backends.cudnn.conv, torch.backends.cuda.matmul
    before = conv.fp32_precision, matmul.fp32_precision
    try:
        conv.fp32_precision = "tf32"  # PyTorch's default for convolutions on Ampere and later
        ieee_fp32(torch)
        assert conv.fp32_precision == "ieee" and matmul.fp32_precision == "ieee"
    finally:
        conv.fp32_precision, matmul.fp32_precision = before  # the flags are process-wide


def test_exclusive_waits_for_shared_holders_and_holds_them_off() -> None:
    lock = SharedExclusiveLock()
    events: list[str] = []
    release = threading.Event()

    def reader(name: str) -> None:
        with lock.shared():
            events.append(f"{name} in")
            release.wait(2)
            events.append(f"{name} out")

    def writer() -> None:
        with lock.exclusive():
            events.append("capture")

    readers = [threading.Thread(target=reader, args=(f"r{i}",)) for i in range(2)]
    for thread in readers:
        thread.start()
    while len(events) < 2:
        time.sleep(0.005)
    capture = threading.Thread(target=writer)
    capture.start()
    time.sleep(0.05)
    assert "capture" not in events  # two runs in flight: the capture waits
    release.set()
    capture.join(2)
    for thread in readers:
        thread.join(2)
    assert events.index("capture") > max(events.index("r0 out"), events.index("r1 out"))


# -- on a GPU ------------------------------------------------------------------------------------------------


def cuda_available() -> bool:
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU")
@pytest.mark.parametrize("name", sorted(SHAPES))
def test_every_shipped_model_captures_at_each_batch_size(store: ModelStore, name: str) -> None:
    path = runnable(store, name)
    model = TorchModel(path, device="cuda", precision="fp16")
    shapes = [{k: (batch, *v[1:]) for k, v in SHAPES[name].items()} for batch in (1, 2, 4)]
    outcomes = model.prepare_graphs(shapes)
    assert list(outcomes.values()) == ["captured"] * 3
    feeds = feeds_for(name)
    want = OnnxModel(path).run(feeds)
    got = model.run(feeds)  # replays the batch-2 graph
    for a, b in zip(got, want, strict=True):
        assert float(np.abs(a - b).max()) < 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not cuda_available(), reason="needs an NVIDIA GPU")
def test_capture_on_one_thread_while_another_runs_eagerly(store: ModelStore) -> None:
    eager = TorchModel(store.ensure("realesr_animevideov3_x2"), device="cuda", cuda_graphs=False)
    graphs = TorchModel(runnable(store, "retinaface_mnet025"), device="cuda", precision="fp16")
    errors: list[BaseException] = []
    stop = threading.Event()

    def busy() -> None:
        x = {"input": np.random.default_rng(0).random((2, 3, 64, 64), dtype=np.float32)}
        while not stop.is_set():
            try:
                eager.run(x)
            except BaseException as exc:  # noqa: BLE001 - every failure is what this test counts
                errors.append(exc)

    worker = threading.Thread(target=busy)
    worker.start()
    try:
        outcomes = graphs.prepare_graphs([{"input": (b, 3, 96, 128)} for b in (1, 2, 4, 8)])
    finally:
        stop.set()
        worker.join(30)
    assert errors == [] and set(outcomes.values()) == {"captured"}
