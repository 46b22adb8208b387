"""A face swapper with exactly inswapper_128's contract and cost, and UNTRAINED random weights.

No face-swap weights can be fetched by the project, so this network stands in for inswapper_128 wherever
the plumbing, the cost or the speed of the real model is what matters: same input and output names,
shapes, dtypes and value ranges, same trailing `emap` initializer, and the same layer structure (hence
about the same parameter count and multiply-accumulates per face). Its output is not a face swap.

Contract (as inswapper_128.onnx):
  target  float32 [1, 3, 128, 128]  RGB in [0, 1], a crop aligned to the arcface template at 128 px
  source  float32 [1, 512]          latent: normed_embedding @ emap, then L2-normalised
  output  float32 [1, 3, 128, 128]  RGB in [0, 1]
  emap    the graph's last initializer, float32 [512, 512]; read by the host, unused inside the graph

The batch is fixed at 1 as in the real file, but every op is batch-agnostic, so
`engines.onnx_batch.make_batch_dynamic` can turn it into a batched model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from engines.onnx_batch import save_model_atomic

OPSET = 17
IR_VERSION = 8
LEAKY_SLOPE = 0.2
LATENT_DIM = 512
STYLE_BLOCKS = 6
NARROW_DIVISOR = 16
UNTRAINED_NOTE = (
    "UNTRAINED reference network: weights are random (fixed seed) and produce no meaningful output; "
    "it only reproduces the real model's input/output contract and cost."
)

Width = Literal["full", "narrow"]


@dataclass
class NetBuilder:
    """Accumulates nodes and seeded random initializers for a small ONNX graph."""

    seed: int
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[TensorProto] = field(default_factory=list)
    _rng: np.random.Generator = field(init=False)
    _count: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.ascontiguousarray(array), name))
        return name

    def random(self, name: str, shape: tuple[int, ...], std: float) -> str:
        values = self._rng.standard_normal(math.prod(shape), dtype=np.float32)
        values *= np.float32(std)
        return self.const(name, values.reshape(shape))

    def op(self, op_type: str, inputs: list[str], n_outputs: int = 1, **attrs: Any) -> list[str]:
        name = self.fresh(op_type.lower())
        outputs = [f"{name}_out{i}" if n_outputs > 1 else name for i in range(n_outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outputs, name=name, **attrs))
        return outputs

    def op1(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        return self.op(op_type, inputs, **attrs)[0]

    def conv(self, x: str, c_in: int, c_out: int, kernel: int, *, stride: int = 1, pad: int = 0, gain: float) -> str:
        """Conv with bias; weights N(0, gain^2 / fan_in), bias zero."""
        stem = self.fresh("conv")
        fan_in = c_in * kernel * kernel
        weight = self.random(f"{stem}.weight", (c_out, c_in, kernel, kernel), gain / math.sqrt(fan_in))
        bias = self.const(f"{stem}.bias", np.zeros(c_out, np.float32))
        return self.op1(
            "Conv",
            [x, weight, bias],
            kernel_shape=[kernel, kernel],
            strides=[stride, stride],
            pads=[pad] * 4,
        )

    def reflect_pad(self, x: str, pad: int) -> str:
        pads = self.const(self.fresh("pads"), np.array([0, 0, pad, pad, 0, 0, pad, pad], np.int64))
        return self.op1("Pad", [x, pads], mode="reflect")

    def leaky(self, x: str) -> str:
        return self.op1("LeakyRelu", [x], alpha=LEAKY_SLOPE)

    def model(
        self,
        inputs: list[onnx.ValueInfoProto],
        outputs: list[onnx.ValueInfoProto],
        *,
        graph_name: str,
        kind: str,
        extra_metadata: dict[str, str],
    ) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, graph_name, inputs, outputs, initializer=self.initializers)
        graph.doc_string = UNTRAINED_NOTE
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="swapcast",
            doc_string=f"swapcast reference {kind}. {UNTRAINED_NOTE}",
        )
        model.ir_version = IR_VERSION
        metadata = {"untrained": "true", "swapcast.reference": kind, "swapcast.reference.seed": str(self.seed)}
        metadata.update(extra_metadata)
        helper.set_model_props(model, metadata)
        return model


LEAKY_GAIN = math.sqrt(2.0 / (1.0 + LEAKY_SLOPE**2))
RELU_GAIN = math.sqrt(2.0)
# Spread of the AdaIN style projection: with a unit-norm latent, gamma ~ 1 +- 0.2 and beta ~ 0 +- 0.2.
STYLE_STD = 0.2
# Gain of the last 7x7 conv, chosen so tanh sees a spread of about one: outputs use the whole (0, 1) range
# without piling up at the ends.
OUTPUT_GAIN = 0.25


def _adain(b: NetBuilder, x: str, latent: str, channels: int, ones: str, zeros: str) -> str:
    """InstanceNorm without affine, then x * gamma + beta with (gamma, beta) a linear map of the latent."""
    stem = b.fresh("style")
    weight = b.random(f"{stem}.weight", (2 * channels, LATENT_DIM), STYLE_STD)
    bias = np.zeros(2 * channels, np.float32)
    bias[:channels] = 1.0
    b.const(f"{stem}.bias", bias)
    style = b.op1("Gemm", [latent, weight, f"{stem}.bias"], transB=1)
    shape = b.const(f"{stem}.shape", np.array([0, 2 * channels, 1, 1], np.int64))
    style = b.op1("Reshape", [style, shape])
    split = b.const(f"{stem}.split", np.array([channels, channels], np.int64))
    gamma, beta = b.op("Split", [style, split], n_outputs=2, axis=1)
    normed = b.op1("InstanceNormalization", [x, ones, zeros], epsilon=1e-5)
    return b.op1("Add", [b.op1("Mul", [normed, gamma]), beta])


def _style_block(b: NetBuilder, x: str, latent: str, channels: int, ones: str, zeros: str) -> str:
    h = b.conv(b.reflect_pad(x, 1), channels, channels, 3, gain=RELU_GAIN)
    h = b.op1("Relu", [_adain(b, h, latent, channels, ones, zeros)])
    h = b.conv(b.reflect_pad(h, 1), channels, channels, 3, gain=RELU_GAIN)
    h = _adain(b, h, latent, channels, ones, zeros)
    return b.op1("Add", [x, h])


def _upsample(b: NetBuilder, x: str) -> str:
    scales = b.const(b.fresh("scales"), np.array([1.0, 1.0, 2.0, 2.0], np.float32))
    return b.op1(
        "Resize",
        [x, "", scales],
        mode="nearest",
        coordinate_transformation_mode="asymmetric",
        nearest_mode="floor",
    )


def swapper_model(width: Width = "narrow", seed: int = 0) -> onnx.ModelProto:
    """The reference swapper as an in-memory ONNX model (see the module docstring for the contract).

    "full" has inswapper_128's channel widths (128/256/512/1024, about 138M parameters and 175 GMAC per
    face); "narrow" divides every internal width by 16 for quick tests. Weights are untrained.
    """
    if width not in ("full", "narrow"):
        raise ValueError(f"width must be 'full' or 'narrow', not {width!r}")
    div = 1 if width == "full" else NARROW_DIVISOR
    c1, c2, c3, c4 = (c // div for c in (128, 256, 512, 1024))
    b = NetBuilder(seed)

    # Encoder: 128x128 -> 32x32, with inswapper's layout (the first 3x3 keeps 128x128; the next two halve).
    x = b.leaky(b.conv(b.reflect_pad("target", 3), 3, c1, 7, gain=LEAKY_GAIN))
    x = b.leaky(b.conv(x, c1, c2, 3, pad=1, gain=LEAKY_GAIN))
    x = b.leaky(b.conv(x, c2, c3, 3, stride=2, pad=1, gain=LEAKY_GAIN))
    x = b.leaky(b.conv(x, c3, c4, 3, stride=2, pad=1, gain=LEAKY_GAIN))

    ones = b.const("instnorm.scale", np.ones(c4, np.float32))
    zeros = b.const("instnorm.bias", np.zeros(c4, np.float32))
    for _ in range(STYLE_BLOCKS):
        x = _style_block(b, x, "source", c4, ones, zeros)

    # Decoder: 32x32 -> 128x128.
    x = b.leaky(b.conv(_upsample(b, x), c4, c3, 3, pad=1, gain=LEAKY_GAIN))
    x = b.leaky(b.conv(_upsample(b, x), c3, c2, 3, pad=1, gain=LEAKY_GAIN))
    x = b.leaky(b.conv(x, c2, c1, 3, pad=1, gain=LEAKY_GAIN))
    x = b.conv(b.reflect_pad(x, 3), c1, 3, 7, gain=OUTPUT_GAIN)
    x = b.op1("Tanh", [x])
    x = b.op1("Add", [x, b.const("one", np.array(1.0, np.float32))])
    half = b.const("half", np.array(0.5, np.float32))
    b.nodes.append(helper.make_node("Mul", [x, half], ["output"], name="to_unit_range"))

    # emap last, as in inswapper_128.onnx: the host maps arcface embeddings to latents with it.
    emap = np.random.default_rng([seed, 0xE3A9]).standard_normal((LATENT_DIM, LATENT_DIM), dtype=np.float32)
    emap *= np.float32(1.0 / math.sqrt(LATENT_DIM))
    b.const("emap", emap)

    inputs = [
        helper.make_tensor_value_info("target", TensorProto.FLOAT, [1, 3, 128, 128]),
        helper.make_tensor_value_info("source", TensorProto.FLOAT, [1, LATENT_DIM]),
    ]
    outputs = [helper.make_tensor_value_info("output", TensorProto.FLOAT, [1, 3, 128, 128])]
    return b.model(
        inputs,
        outputs,
        graph_name=f"reference_inswapper_128_{width}",
        kind="swapper",
        extra_metadata={"swapcast.reference.width": width},
    )


def build_reference_swapper(path: Path, width: Width = "narrow", seed: int = 0) -> Path:
    """Write the UNTRAINED reference swapper (inswapper_128's contract) to `path`; returns `path`.

    The file is written to a temporary name in the same folder and renamed into place. "full" is about
    554 MB.
    """
    return save_model_atomic(swapper_model(width, seed), Path(path))


if __name__ == "__main__":  # pragma: no cover - manual measurement aid
    import sys
    import tempfile
    import time

    from engines.model_cost import model_cost

    for kind in sys.argv[1:] or ["narrow", "full"]:
        with tempfile.TemporaryDirectory() as tmp:
            started = time.perf_counter()
            built = build_reference_swapper(Path(tmp) / f"swapper_{kind}.onnx", kind)  # type: ignore[arg-type]
            elapsed = time.perf_counter() - started
            cost = model_cost(built)
            size = built.stat().st_size / 1e6
            print(f"{kind}: {cost}; {size:.1f} MB written in {elapsed:.1f} s")
