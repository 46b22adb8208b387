"""Torch mirrors of the imported and reference networks, against ONNX Runtime on real face crops, and the
hand-written ONNX export of those networks back again."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

from engines.errors import ModelError
from engines.export import export_verified, run_onnx, sample_inputs, torch_outputs
from engines.model_cost import model_cost
from engines.torchnets import (
    SRVGG,
    RRDBNet,
    RRDBSpec,
    SRVGGSpec,
    Swapper,
    SwapperSpec,
    load_onnx_net,
    net_from_spec,
    spec_of,
)
from engines.torchnets.rrdbnet import as_growth
from tests.engines.faces import face_batch

torch.set_num_threads(2)

TOLERANCE = 1e-4
SR_PROBE = {"input": [1, 3, 8, 8]}


def ort_run(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["output"], feeds)[0])


def torch_run(net: torch.nn.Module, *inputs: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return np.asarray(net(*(torch.from_numpy(x) for x in inputs)).numpy())


@pytest.mark.parametrize(
    ("name", "scale"), [("realesr_animevideov3_x2", 2), ("realesr_animevideov3_x3", 3), ("realesr_animevideov3_x4", 4)]
)
def test_srvgg_equals_onnxruntime(name: str, scale: int, model: Callable[[str], Path]) -> None:
    path = model(name)
    net = SRVGG.from_onnx(path)
    assert net.spec.widths == (64,) * 17 and net.spec.shuffle == 4
    assert net.spec.scale == scale  # the ncnn x2/x3 files upscale 4x, then resize by 0.5 / 0.75
    x = face_batch(24)
    expected = ort_run(path, {"input": x})
    got = torch_run(net, x)
    assert got.shape == expected.shape == (2, 3, 24 * scale, 24 * scale)
    assert float(np.abs(got - expected).max()) <= TOLERANCE
    assert float(expected.std()) > 0.05  # an image, not a constant


@pytest.mark.slow
def test_rrdbnet_equals_onnxruntime(model: Callable[[str], Path]) -> None:
    path = model("realesrgan_x4plus")
    net = RRDBNet.from_onnx(path)
    assert net.spec == RRDBSpec.standard()
    graph = onnx.load(str(path)).graph
    conv_inputs = {name for node in graph.node if node.op_type == "Conv" for name in node.input[1:]}
    conv_params = sum(int(np.prod(i.dims)) for i in graph.initializer if i.name in conv_inputs)
    assert sum(p.numel() for p in net.parameters()) == conv_params
    x = face_batch(16)[:1]
    expected = ort_run(path, {"input": x})
    got = torch_run(net, x)
    assert got.shape == (1, 3, 64, 64)
    assert float(np.abs(got - expected).max()) <= TOLERANCE
    assert float(expected.std()) > 0.05


def test_swapper_equals_onnxruntime(model: Callable[[str], Path]) -> None:
    path = model("reference_swapper_narrow")
    net = Swapper.from_onnx(path)
    assert net.spec == SwapperSpec.divided(16)
    emap = onnx.numpy_helper.to_array(onnx.load(str(path)).graph.initializer[-1])
    assert np.array_equal(net.emap.numpy(), emap)
    target = face_batch(128)
    latent = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)
    latent /= np.linalg.norm(latent, axis=1, keepdims=True)
    expected = np.concatenate(
        [ort_run(path, {"target": target[i : i + 1], "source": latent[i : i + 1]}) for i in range(2)]
    )
    got = torch_run(net, target, latent)
    assert float(np.abs(got - expected).max()) <= TOLERANCE
    assert float(np.abs(expected[0] - expected[1]).max()) > 0.05


def test_wrong_architecture_is_a_model_error(model: Callable[[str], Path], tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="not an SRVGG"):
        SRVGG.from_onnx(model("realesrgan_x4plus"))
    with pytest.raises(ModelError, match="RRDBNet"):
        RRDBNet.from_onnx(model("realesr_animevideov3_x4"))
    with pytest.raises(ModelError, match="layout"):
        Swapper.from_onnx(model("realesr_animevideov3_x4"))
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    with pytest.raises(ModelError, match="junk.onnx"):
        load_onnx_net(junk)


def _small_rrdb(seed: int = 0) -> RRDBNet:
    torch.manual_seed(seed)
    growth = tuple(
        as_growth(g) for g in ([5, 6, 7, 8], [4, 4, 4, 4], [3, 8, 2, 6], [6, 6, 6, 6], [2, 3, 4, 5], [7, 1, 7, 1])
    )
    net = RRDBNet(RRDBSpec(12, growth, 10, 9, 8))
    with torch.no_grad():  # lively biases: exercise their path through the export too
        for conv in net.convs_in_order():
            assert conv.bias is not None
            conv.bias.uniform_(-0.1, 0.1)
    return net.eval()


@pytest.mark.parametrize(
    "make",
    [
        lambda: _small_rrdb(),
        lambda: SRVGG(SRVGGSpec((8, 5, 7, 6), shuffle=4, out_scale=0.5)),
        lambda: SRVGG(SRVGGSpec((9, 4), shuffle=3)),
        lambda: Swapper(SwapperSpec(4, 6, 8, 12, blocks=2)),
    ],
    ids=["rrdbnet", "srvgg_x2", "srvgg_x3", "swapper"],
)
@pytest.mark.slow
def test_export_round_trip(make: Callable[[], torch.nn.Module], tmp_path: Path) -> None:
    torch.manual_seed(3)
    net = make().eval()
    if isinstance(net, Swapper):
        with torch.no_grad():
            net.emap.copy_(torch.randn(512, 512))
    path = tmp_path / "net.onnx"
    diff = export_verified(net, path, feeds=sample_inputs(net, size=13, batch=2))
    assert diff <= TOLERANCE
    # Another size and batch than the one checked at export: H, W and N are symbolic.
    feeds = sample_inputs(net, size=11, batch=3, seed=5)
    assert float(np.abs(run_onnx(path, feeds) - torch_outputs(net, feeds)).max()) <= TOLERANCE
    back = load_onnx_net(path)
    assert spec_of(back) == spec_of(net)
    assert float(np.abs(torch_outputs(back, feeds) - torch_outputs(net, feeds)).max()) <= 1e-6
    rebuilt = net_from_spec(spec_of(net))
    assert [p.shape for p in rebuilt.parameters()] == [p.shape for p in net.parameters()]


def test_swapper_export_keeps_the_inswapper_contract(tmp_path: Path) -> None:
    torch.manual_seed(0)
    net = Swapper(SwapperSpec(4, 6, 8, 12, blocks=1))
    emap = torch.randn(512, 512)
    with torch.no_grad():
        net.emap.copy_(emap)
    path = tmp_path / "student.onnx"
    export_verified(net, path)
    model = onnx.load(str(path))
    assert [i.name for i in model.graph.input] == ["target", "source"]
    assert [o.name for o in model.graph.output] == ["output"]
    dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.input]
    assert dims == [["batch", 3, 128, 128], ["batch", 512]]
    last = model.graph.initializer[-1]
    assert last.name == "emap" and np.array_equal(onnx.numpy_helper.to_array(last), emap.numpy())
    assert not any("emap" in node.input for node in model.graph.node)


def test_export_reproduces_the_imported_file(model: Callable[[str], Path], tmp_path: Path) -> None:
    path = model("realesr_animevideov3_x2")
    out = tmp_path / "again.onnx"
    export_verified(SRVGG.from_onnx(path), out)
    x = face_batch(20)
    assert float(np.abs(ort_run(path, {"input": x}) - ort_run(out, {"input": x})).max()) <= 1e-6
    assert model_cost(out, input_shapes=SR_PROBE) == model_cost(path, input_shapes=SR_PROBE)
