"""Reference networks (untrained stand-ins with the real models' contracts), their cost and batching."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engines.errors import ModelError
from engines.model_cost import model_cost
from engines.onnx_batch import make_batch_dynamic, save_model_atomic
from engines.reference.recognizer import build_reference_recognizer
from engines.reference.swapper import build_reference_swapper


def _session(path: Path | bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3  # the unused `emap` initializer is expected
    options.intra_op_num_threads = 1
    source = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _latents(rng: np.random.Generator, n: int) -> np.ndarray:
    latent = rng.standard_normal((n, 512)).astype(np.float32)
    return latent / np.linalg.norm(latent, axis=1, keepdims=True)


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in value.type.tensor_type.shape.dim]


def _metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {prop.key: prop.value for prop in model.metadata_props}


@pytest.fixture(scope="module")
def narrow_swapper(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_reference_swapper(tmp_path_factory.mktemp("swapper") / "inswapper_128.onnx")


@pytest.fixture(scope="module")
def swap_inputs() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    return {"target": rng.random((1, 3, 128, 128), dtype=np.float32), "source": _latents(rng, 1)}


# --- swapper contract ------------------------------------------------------------------------------


def test_narrow_swapper_has_inswapper_contract(narrow_swapper: Path) -> None:
    model = onnx.load(str(narrow_swapper))
    onnx.checker.check_model(model, full_check=True)
    graph = model.graph
    inputs = {v.name: v for v in graph.input}
    assert list(inputs) == ["target", "source"]
    assert _dims(inputs["target"]) == [1, 3, 128, 128]
    assert _dims(inputs["source"]) == [1, 512]
    assert [v.name for v in graph.output] == ["output"]
    assert _dims(graph.output[0]) == [1, 3, 128, 128]
    for value in [*graph.input, *graph.output]:
        assert value.type.tensor_type.elem_type == TensorProto.FLOAT

    emap = graph.initializer[-1]
    assert emap.name == "emap"
    assert emap.data_type == TensorProto.FLOAT
    assert list(emap.dims) == [512, 512]
    assert np.isfinite(numpy_helper.to_array(emap)).all()
    assert all("emap" not in node.input for node in graph.node)

    metadata = _metadata(model)
    assert metadata["untrained"] == "true"
    assert metadata["swapcast.reference"] == "swapper"
    assert "UNTRAINED" in model.doc_string


def test_narrow_swapper_never_hard_codes_the_batch(narrow_swapper: Path) -> None:
    model = onnx.load(str(narrow_swapper))
    inits = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    reshapes = [node for node in model.graph.node if node.op_type == "Reshape"]
    assert reshapes, "the AdaIN style vectors are reshaped"
    for node in reshapes:
        assert int(inits[node.input[1]][0]) in (0, -1), node.name
    ops = {node.op_type for node in model.graph.node}
    assert {"Conv", "InstanceNormalization", "Gemm", "Resize", "Tanh", "Pad"} <= ops


def test_narrow_swapper_runs_in_unit_range_and_depends_on_both_inputs(
    narrow_swapper: Path, swap_inputs: dict[str, np.ndarray]
) -> None:
    session = _session(narrow_swapper)
    (out,) = session.run(None, swap_inputs)
    assert out.shape == (1, 3, 128, 128)
    assert out.dtype == np.float32
    assert out.min() >= 0.0 and out.max() <= 1.0
    assert out.std() > 0.05
    # Not saturated: most pixels sit well inside (0, 1).
    assert np.mean((out > 0.02) & (out < 0.98)) > 0.8

    rng = np.random.default_rng(8)
    (other_source,) = session.run(None, {**swap_inputs, "source": _latents(rng, 1)})
    (other_target,) = session.run(None, {**swap_inputs, "target": rng.random((1, 3, 128, 128), dtype=np.float32)})
    assert np.abs(other_source - out).max() > 1e-3
    assert np.abs(other_target - out).max() > 1e-3


def test_swapper_is_deterministic_per_seed(
    tmp_path: Path, narrow_swapper: Path, swap_inputs: dict[str, np.ndarray]
) -> None:
    again = build_reference_swapper(tmp_path / "again.onnx", "narrow", seed=0)
    other = build_reference_swapper(tmp_path / "other.onnx", "narrow", seed=1)
    assert again.read_bytes() == narrow_swapper.read_bytes()
    (base,) = _session(narrow_swapper).run(None, swap_inputs)
    (same,) = _session(again).run(None, swap_inputs)
    (different,) = _session(other).run(None, swap_inputs)
    np.testing.assert_array_equal(base, same)
    assert np.abs(base - different).max() > 1e-3
    assert _metadata(onnx.load(str(other)))["swapcast.reference.seed"] == "1"


def test_swapper_rejects_unknown_width(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="width"):
        build_reference_swapper(tmp_path / "x.onnx", "wide")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_full_swapper_costs_what_inswapper_costs(tmp_path: Path, narrow_swapper: Path) -> None:
    path = build_reference_swapper(tmp_path / "full.onnx", "full")
    assert [p.name for p in tmp_path.iterdir()] == ["full.onnx"]  # no temporary file left behind
    assert 530e6 < path.stat().st_size < 580e6
    cost = model_cost(path)
    assert cost.params == pytest.approx(138.3e6, rel=0.05)
    assert cost.macs == pytest.approx(175e9, rel=0.05)
    assert cost.unused_params == 512 * 512
    assert set(cost.macs_by_op) == {"Conv", "Gemm"}

    narrow = model_cost(narrow_swapper)
    # Inner convolutions shrink with the square of the width divisor (16), the two RGB-facing ones and
    # the latent projections only linearly.
    assert narrow.unused_params == 512 * 512
    assert 200 < cost.macs_by_op["Conv"] / narrow.macs_by_op["Conv"] < 256
    assert cost.macs_by_op["Gemm"] == 16 * narrow.macs_by_op["Gemm"]


# --- recognizer ------------------------------------------------------------------------------------


def test_recognizer_has_arcface_contract_and_dynamic_batch(tmp_path: Path) -> None:
    path = build_reference_recognizer(tmp_path / "w600k_r50.onnx")
    model = onnx.load(str(path))
    onnx.checker.check_model(model, full_check=True)
    assert [v.name for v in model.graph.input] == ["input.1"]
    (inp,) = model.graph.input
    (out,) = model.graph.output
    batch = _dims(inp)[0]
    assert isinstance(batch, str) and batch
    assert _dims(inp)[1:] == [3, 112, 112]
    assert _dims(out) == [batch, 512]
    assert inp.type.tensor_type.elem_type == TensorProto.FLOAT
    assert out.type.tensor_type.elem_type == TensorProto.FLOAT
    assert _metadata(model)["untrained"] == "true"
    assert _metadata(model)["swapcast.reference"] == "recognizer"

    rng = np.random.default_rng(3)
    faces = rng.integers(0, 256, size=(4, 3, 112, 112)).astype(np.float32)
    faces = (faces - 127.5) / 127.5
    session = _session(path)
    (embeddings,) = session.run(None, {"input.1": faces})
    assert embeddings.shape == (4, 512) and embeddings.dtype == np.float32
    assert np.isfinite(embeddings).all()
    for i in range(4):
        (alone,) = session.run(None, {"input.1": faces[i : i + 1]})
        np.testing.assert_allclose(alone[0], embeddings[i], atol=1e-5)
    unit = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    assert float(np.abs(unit[0] @ unit[1])) < 0.9999  # different faces, different embeddings

    cost = model_cost(path)  # the free batch dimension is measured at 1
    convs = 3 * 32 * 9 * 56**2 + 32 * 64 * 9 * 28**2 + 64 * 128 * 9 * 14**2 + 128 * 256 * 9 * 7**2
    assert cost.macs == convs + 256 * 512
    assert cost.unused_params == 0


# --- model_cost ------------------------------------------------------------------------------------


def _tiny_model(*, free_spatial: bool = False) -> onnx.ModelProto:
    rng = np.random.default_rng(0)

    def init(name: str, shape: tuple[int, ...]) -> TensorProto:
        return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)

    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["a", "w2"], ["b"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=4),
        helper.make_node("ConvTranspose", ["b", "w3"], ["c"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["c"], ["d"], axis=1),
        helper.make_node("Gemm", ["d", "w4"], ["e"], transB=1),
        helper.make_node("Reshape", ["e", "shape"], ["f"]),
        helper.make_node("MatMul", ["f", "w5"], ["y"]),
    ]
    spatial: list[int | str] = ["h", "w"] if free_spatial else [8, 8]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, *spatial])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[
            init("w1", (8, 3, 3, 3)),
            init("w2", (8, 2, 3, 3)),
            init("w3", (8, 4, 2, 2)),
            init("w4", (10, 4 * 16 * 16)),
            numpy_helper.from_array(np.array([0, 2, 5], np.int64), "shape"),
            init("w5", (5, 7)),
            init("spare", (6, 6)),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_model_cost_counts_each_layer_kind() -> None:
    cost = model_cost(_tiny_model())
    conv = 8 * 8 * 8 * (3 * 9) + 8 * 8 * 8 * (2 * 9)  # grouped: 8 input channels in 4 groups of 2
    conv_t = (8 * 8 * 8) * 4 * 4  # each input element feeds 4 channels x 2x2 kernel
    gemm = 1 * 1024 * 10
    matmul = 2 * 7 * 5  # [1, 2, 5] @ [5, 7]
    assert cost.macs_by_op == {"Conv": conv, "ConvTranspose": conv_t, "Gemm": gemm, "MatMul": matmul}
    assert cost.macs == conv + conv_t + gemm + matmul
    assert cost.params == 8 * 27 + 8 * 18 + 8 * 4 * 4 + 10 * 1024 + 35  # int64 shape not counted
    assert cost.unused_params == 36


def test_model_cost_needs_sizes_for_free_dimensions(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="input_shapes"):
        model_cost(_tiny_model(free_spatial=True))
    with_sizes = model_cost(_tiny_model(free_spatial=True), input_shapes={"x": [1, 3, 8, 8]})
    assert with_sizes == model_cost(_tiny_model())
    with pytest.raises(ModelError, match="no such model"):
        model_cost(tmp_path / "missing.onnx")


# --- make_batch_dynamic ----------------------------------------------------------------------------


def test_make_batch_dynamic_on_narrow_swapper_matches_per_item(tmp_path: Path, narrow_swapper: Path) -> None:
    dst = make_batch_dynamic(narrow_swapper, tmp_path / "batched.onnx")
    assert [p.name for p in tmp_path.iterdir()] == ["batched.onnx"]
    original = onnx.load(str(narrow_swapper))
    batched = onnx.load(str(dst))
    onnx.checker.check_model(batched)
    for value in [*batched.graph.input, *batched.graph.output]:
        assert _dims(value)[0] == "batch"
    assert [i.name for i in batched.graph.initializer] == [i.name for i in original.graph.initializer]
    assert batched.graph.initializer[-1].name == "emap"
    assert batched.graph.initializer[-1].raw_data == original.graph.initializer[-1].raw_data
    assert _metadata(batched)["untrained"] == "true"

    # Check the claim independently of make_batch_dynamic's own verification.
    rng = np.random.default_rng(11)
    targets = rng.random((3, 3, 128, 128), dtype=np.float32)
    sources = _latents(rng, 3)
    (together,) = _session(dst).run(None, {"target": targets, "source": sources})
    single = _session(narrow_swapper)
    for i in range(3):
        (alone,) = single.run(None, {"target": targets[i : i + 1], "source": sources[i : i + 1]})
        assert np.abs(alone - together[i : i + 1]).max() <= 1e-5
    assert np.abs(together[0] - together[1]).max() > 1e-3

    # Caller-supplied inputs of another batch size are accepted too.
    again = make_batch_dynamic(
        narrow_swapper,
        tmp_path / "batched2.onnx",
        verify_inputs={"target": targets[:2], "source": sources[:2]},
    )
    assert again.read_bytes() == dst.read_bytes()


def _single_input_model(nodes: list[onnx.NodeProto], inits: list[TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 2, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 2, 2])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _shape(name: str, *dims: int) -> TensorProto:
    return numpy_helper.from_array(np.array(dims, np.int64), name)


def test_make_batch_dynamic_rewrites_reshapes_that_hard_code_batch_one(tmp_path: Path) -> None:
    weight = numpy_helper.from_array(np.random.default_rng(1).standard_normal((16, 16)).astype(np.float32), "w")
    marker = numpy_helper.from_array(np.ones((2, 2), np.float32), "last")
    model = _single_input_model(
        [
            helper.make_node("Reshape", ["x", "flat"], ["f"]),
            helper.make_node("MatMul", ["f", "w"], ["m"]),
            helper.make_node("Reshape", ["m", "back"], ["y"]),
        ],
        [_shape("flat", 1, 16), weight, _shape("back", 1, 4, 2, 2), marker],
    )
    src = save_model_atomic(model, tmp_path / "fixed.onnx")
    dst = make_batch_dynamic(src, tmp_path / "dynamic.onnx")
    rewritten = onnx.load(str(dst))
    shapes = {i.name: numpy_helper.to_array(i).tolist() for i in rewritten.graph.initializer}
    assert shapes["flat"] == [0, 16]
    assert shapes["back"] == [0, 4, 2, 2]
    assert rewritten.graph.initializer[-1].name == "last"

    x = np.random.default_rng(2).standard_normal((5, 4, 2, 2)).astype(np.float32)
    (y,) = _session(dst).run(None, {"x": x})
    expected = (x.reshape(5, 16) @ numpy_helper.to_array(weight)).reshape(5, 4, 2, 2)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["fixed_output", "total_size_reshape", "mixes_items"])
def test_make_batch_dynamic_refuses_graphs_that_are_not_per_item(tmp_path: Path, kind: str) -> None:
    flatten_all = [
        helper.make_node("Reshape", ["x", "all"], ["f"]),
        helper.make_node("Relu", ["f"], ["r"]),
        helper.make_node("Reshape", ["r", "back"], ["u"]),
    ]
    shapes = [_shape("all", 16), _shape("back", 1, 4, 2, 2)]
    if kind == "fixed_output":
        # Flattens the whole tensor to a fixed element count and returns that: shape inference sees the
        # output keep its fixed 1.
        model = _single_input_model([*flatten_all, helper.make_node("Identity", ["u"], ["y"])], shapes)
    elif kind == "total_size_reshape":
        # Same flattening, broadcast back onto the input: the output looks batched to shape inference,
        # but a batch of 3 no longer fits the fixed element count when it runs.
        model = _single_input_model([*flatten_all, helper.make_node("Add", ["x", "u"], ["y"])], shapes)
    else:
        # Subtracts the mean over the batch: each item's result depends on the others.
        model = _single_input_model(
            [
                helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1),
                helper.make_node("Mul", ["x", "x"], ["sq"]),
                helper.make_node("Sub", ["sq", "mean"], ["y"]),
            ],
            [],
        )
    src = save_model_atomic(model, tmp_path / "model.onnx")
    with pytest.raises(ModelError, match="cannot be made batch-dynamic") as caught:
        make_batch_dynamic(src, tmp_path / "out.onnx")
    assert "\n" not in str(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]


def test_make_batch_dynamic_refuses_a_batch_other_than_one(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
    )
    src = save_model_atomic(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "m.onnx")
    with pytest.raises(ModelError, match="leading dimension of 2"):
        make_batch_dynamic(src, tmp_path / "out.onnx")


def test_model_cost_sizes_tiny_conv_weights() -> None:
    """A conv weight small enough to be kept as a constant during shape inference is still counted."""
    from onnx import TensorProto, helper, numpy_helper

    weight = numpy_helper.from_array(np.ones((4, 2, 3, 3), np.float32), "w")
    conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [conv],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [weight],
    )
    cost = model_cost(helper.make_model(graph))
    assert cost.params == 72
    assert cost.macs == 8 * 8 * 4 * 2 * 9
