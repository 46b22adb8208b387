"""Export the torch networks of `engines.torchnets` to ONNX with the contract of the model they replace.

The graphs are written node by node with onnx.helper rather than traced, so the exported file has exactly
the operators of the imported originals (and `from_onnx` reads it back): initializers are named after the
torch parameters, and the files are deterministic.

Contracts:
  super-resolution  input `input` [N, 3, H, W] float32 RGB 0..1, output `output` [N, 3, sH, sW], N, H and W
                    symbolic (as the Real-ESRGAN imports)
  swapper           inswapper_128's: `target` [N, 3, 128, 128] RGB 0..1, `source` [N, 512] latent, `output`
                    [N, 3, 128, 128] RGB 0..1, the embedding map `emap` [512, 512] as the last initializer
                    (unused inside the graph). N is symbolic unless a fixed batch is asked for; every op is
                    batch-agnostic.

`export_verified` writes the file atomically and checks it in ONNX Runtime against the torch network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import torch
from onnx import TensorProto, helper, numpy_helper
from torch import nn

from engines.errors import ModelError
from engines.onnx_batch import save_model_atomic
from engines.torchnets.rrdbnet import LEAKY_SLOPE as RRDB_SLOPE
from engines.torchnets.rrdbnet import RES_SCALE, RRDBNet
from engines.torchnets.srvgg import SRVGG
from engines.torchnets.swapper import CROP, INSTANCE_EPS, LATENT_DIM, Swapper
from engines.torchnets.swapper import LEAKY_SLOPE as SWAP_SLOPE

OPSET = 17
IR_VERSION = 8
VERIFY_ATOL = 1e-4


class _Graph:
    """Nodes and initializers, named deterministically."""

    def __init__(self, params: Mapping[str, torch.Tensor]) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._names: dict[int, str] = {id(p): name for name, p in params.items()}
        self._done: set[str] = set()
        self._count = 0

    def fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, name: str, value: np.ndarray) -> str:
        if name not in self._done:
            self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
            self._done.add(name)
        return name

    def param(self, tensor: torch.Tensor, shape: Sequence[int] | None = None) -> str:
        name = self._names[id(tensor)]
        value = tensor.detach().cpu().numpy().astype(np.float32)
        return self.const(name, value if shape is None else value.reshape(tuple(shape)))

    def op(self, op_type: str, inputs: Sequence[str], output: str | None = None, **attrs: Any) -> str:
        name = self.fresh(op_type)
        out = output or name
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], name=name, **attrs))
        return out

    def conv(self, x: str, conv: nn.Conv2d, output: str | None = None) -> str:
        inputs = [x, self.param(conv.weight)]
        if conv.bias is not None:
            inputs.append(self.param(conv.bias))
        k = conv.kernel_size[0]
        stride = conv.stride[0]
        pad = conv.padding[0]
        assert isinstance(pad, int)
        return self.op(
            "Conv",
            inputs,
            output,
            kernel_shape=[k, k],
            strides=[stride, stride],
            pads=[pad] * 4,
            dilations=[1, 1],
            group=conv.groups,
        )

    def leaky(self, x: str, slope: float) -> str:
        return self.op("LeakyRelu", [x], alpha=slope)

    def nearest(self, x: str, factor: float) -> str:
        scales = self.const(f"resize_x{factor:g}.scales", np.array([1, 1, factor, factor], np.float32))
        return self.op(
            "Resize", [x, "", scales], mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"
        )


def _image(name: str, batch: int | str, channels: int, height: int | str, width: int | str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, [batch, channels, height, width])


def _finish(
    g: _Graph,
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    graph_name: str,
    doc: str,
    metadata: Mapping[str, str] | None,
) -> onnx.ModelProto:
    graph = helper.make_graph(g.nodes, graph_name, inputs, outputs, initializer=g.initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="swapcast")
    model.ir_version = IR_VERSION
    model.doc_string = doc
    if metadata:
        helper.set_model_props(model, dict(metadata))
    onnx.checker.check_model(model)
    return model


def srvgg_model(net: SRVGG, *, doc: str = "", metadata: Mapping[str, str] | None = None) -> onnx.ModelProto:
    g = _Graph(dict(net.named_parameters()))
    x = "input"
    for conv, act in net.body():
        x = g.conv(x, conv)
        x = g.op("PRelu", [x, g.param(act.weight, (-1, 1, 1))])
    x = g.conv(x, net.last)
    x = g.op("DepthToSpace", [x], blocksize=net.spec.shuffle, mode="CRD")
    skip = g.nearest("input", float(net.spec.shuffle))
    out_scale = net.spec.out_scale
    x = g.op("Add", [x, skip], "output" if out_scale is None else None)
    if out_scale is not None:
        scale = float(out_scale)
        scales = g.const("out_resize.scales", np.array([1, 1, scale, scale], np.float32))
        g.op(
            "Resize",
            [x, "", scales],
            "output",
            mode="cubic",
            coordinate_transformation_mode="half_pixel",
            cubic_coeff_a=-0.75,
            exclude_outside=0,
        )
    inputs = [_image("input", "batch", 3, "height", "width")]
    outputs = [_image("output", "batch", 3, "out_height", "out_width")]
    return _finish(g, inputs, outputs, "srvgg", doc or "SRVGG super-resolution network", metadata)


def rrdbnet_model(net: RRDBNet, *, doc: str = "", metadata: Mapping[str, str] | None = None) -> onnx.ModelProto:
    g = _Graph(dict(net.named_parameters()))
    res = g.const("res_scale", np.array([RES_SCALE], np.float32))
    feat = g.conv("input", net.conv_first)
    body = feat
    for block in net.blocks():
        block_in = body
        for rdb in block.rdb_list():
            *growth, last = rdb.conv_list()
            feats = [body]
            for conv in growth:
                cat = feats[0] if len(feats) == 1 else g.op("Concat", feats, axis=1)
                feats.append(g.leaky(g.conv(cat, conv), RRDB_SLOPE))
            x5 = g.conv(g.op("Concat", feats, axis=1), last)
            body = g.op("Add", [g.op("Mul", [x5, res]), body])
        body = g.op("Add", [g.op("Mul", [body, res]), block_in])
    feat = g.op("Add", [feat, g.conv(body, net.conv_body)])
    feat = g.leaky(g.conv(g.nearest(feat, 2.0), net.conv_up1), RRDB_SLOPE)
    feat = g.leaky(g.conv(g.nearest(feat, 2.0), net.conv_up2), RRDB_SLOPE)
    g.conv(g.leaky(g.conv(feat, net.conv_hr), RRDB_SLOPE), net.conv_last, "output")
    inputs = [_image("input", "batch", 3, "height", "width")]
    outputs = [_image("output", "batch", 3, "out_height", "out_width")]
    return _finish(g, inputs, outputs, "rrdbnet", doc or "RRDBNet x4 super-resolution network", metadata)


def swapper_model(
    net: Swapper, *, batch: int | None = None, doc: str = "", metadata: Mapping[str, str] | None = None
) -> onnx.ModelProto:
    g = _Graph(dict(net.named_parameters()))
    c4 = net.spec.c4
    ones = g.const("instnorm.scale", np.ones(c4, np.float32))
    zeros = g.const("instnorm.bias", np.zeros(c4, np.float32))

    def reflect(x: str, pad: int) -> str:
        pads = g.const(f"pads_{pad}", np.array([0, 0, pad, pad, 0, 0, pad, pad], np.int64))
        return g.op("Pad", [x, pads], mode="reflect")

    def adain(h: str, style: nn.Linear) -> str:
        s = g.op("Gemm", ["source", g.param(style.weight), g.param(style.bias)], transB=1)
        shape = g.const(f"style_shape_{c4}", np.array([0, 2 * c4, 1, 1], np.int64))
        split = g.const(f"style_split_{c4}", np.array([c4, c4], np.int64))
        s = g.op("Reshape", [s, shape])
        gamma, beta = g.fresh("gamma"), g.fresh("beta")
        g.nodes.append(helper.make_node("Split", [s, split], [gamma, beta], name=g.fresh("Split"), axis=1))
        normed = g.op("InstanceNormalization", [h, ones, zeros], epsilon=INSTANCE_EPS)
        return g.op("Add", [g.op("Mul", [normed, gamma]), beta])

    x = g.leaky(g.conv(reflect("target", 3), net.enc1), SWAP_SLOPE)
    for conv in (net.enc2, net.enc3, net.enc4):
        x = g.leaky(g.conv(x, conv), SWAP_SLOPE)
    for block in net.block_list():
        h = g.op("Relu", [adain(g.conv(reflect(x, 1), block.conv1), block.style1)])
        h = adain(g.conv(reflect(h, 1), block.conv2), block.style2)
        x = g.op("Add", [x, h])
    x = g.leaky(g.conv(g.nearest(x, 2.0), net.dec1), SWAP_SLOPE)
    x = g.leaky(g.conv(g.nearest(x, 2.0), net.dec2), SWAP_SLOPE)
    x = g.leaky(g.conv(x, net.dec3), SWAP_SLOPE)
    x = g.op("Tanh", [g.conv(reflect(x, 3), net.out)])
    x = g.op("Add", [x, g.const("one", np.array(1.0, np.float32))])
    g.op("Mul", [x, g.const("half", np.array(0.5, np.float32))], "output")
    g.const("emap", net.emap.detach().cpu().numpy().astype(np.float32))  # last, as inswapper_128 has it
    n: int | str = batch if batch is not None else "batch"
    inputs = [
        _image("target", n, 3, CROP, CROP),
        helper.make_tensor_value_info("source", TensorProto.FLOAT, [n, LATENT_DIM]),
    ]
    outputs = [_image("output", n, 3, CROP, CROP)]
    return _finish(g, inputs, outputs, "swap_student", doc or "swap network with inswapper_128's contract", metadata)


def onnx_model(net: nn.Module, *, doc: str = "", metadata: Mapping[str, str] | None = None) -> onnx.ModelProto:
    if isinstance(net, SRVGG):
        return srvgg_model(net, doc=doc, metadata=metadata)
    if isinstance(net, RRDBNet):
        return rrdbnet_model(net, doc=doc, metadata=metadata)
    if isinstance(net, Swapper):
        return swapper_model(net, doc=doc, metadata=metadata)
    raise TypeError(f"cannot export {type(net).__name__}: not one of swapcast's torch networks")


def sample_inputs(net: nn.Module, *, size: int = 24, batch: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs to check an export with: random images (and unit latents for a swapper)."""
    rng = np.random.default_rng(seed)
    if isinstance(net, Swapper):
        latent = rng.standard_normal((batch, LATENT_DIM)).astype(np.float32)
        latent /= np.linalg.norm(latent, axis=1, keepdims=True)
        return {"target": rng.random((batch, 3, CROP, CROP), dtype=np.float32), "source": latent}
    return {"input": rng.random((batch, 3, size, size), dtype=np.float32)}


def torch_outputs(net: nn.Module, feeds: Mapping[str, np.ndarray]) -> np.ndarray:
    net.eval()
    with torch.no_grad():
        args = [torch.from_numpy(np.ascontiguousarray(v)) for v in feeds.values()]
        return np.asarray(net(*args).numpy())


def run_onnx(path: Path, feeds: Mapping[str, np.ndarray], threads: int = 2) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3  # the unused `emap` initializer is expected, not worth a warning
    session = ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    return np.asarray(session.run(["output"], dict(feeds))[0])


def export_verified(
    net: nn.Module,
    path: Path,
    *,
    feeds: Mapping[str, np.ndarray] | None = None,
    doc: str = "",
    metadata: Mapping[str, str] | None = None,
    atol: float = VERIFY_ATOL,
) -> float:
    """Write `net` to `path` as ONNX, run both on `feeds` (a small random batch by default) and return the
    largest absolute difference; a ModelError (and no file) when it exceeds `atol`."""
    path = Path(path)
    model = onnx_model(net, doc=doc, metadata=metadata)
    feeds = dict(feeds) if feeds is not None else sample_inputs(net)
    save_model_atomic(model, path)
    try:
        diff = float(np.max(np.abs(run_onnx(path, feeds) - torch_outputs(net, feeds))))
    except Exception:
        path.unlink(missing_ok=True)
        raise
    if not diff <= atol:
        path.unlink(missing_ok=True)
        raise ModelError(f"the ONNX export of {type(net).__name__} differs from torch by {diff:.2e} (> {atol:g})")
    return diff
