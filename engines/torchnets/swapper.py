"""The reference swap network (inswapper_128's contract and layer structure) in torch.

Mirrors `engines.reference.swapper.swapper_model` op for op, at any widths:

  encoder  reflect-pad 3, 7x7 conv 3->c1, LeakyReLU; 3x3 conv c1->c2; 3x3 stride-2 convs c2->c3->c4
           (each with LeakyReLU): 128x128 -> 32x32
  style    `blocks` residual blocks at width c4: reflect-pad 1, 3x3 conv, AdaIN, ReLU, reflect-pad 1, 3x3
           conv, AdaIN, added to the block input. AdaIN is an instance norm without affine terms, then
           x * gamma + beta with (gamma, beta) = Linear(latent) split in two.
  decoder  nearest x2, 3x3 conv c4->c3; nearest x2, 3x3 conv c3->c2; 3x3 conv c2->c1 (each with LeakyReLU);
           reflect-pad 3, 7x7 conv c1->3, then (tanh + 1) / 2.

The `emap` buffer travels with the network (it is not trained) so that an exported student keeps its
teacher's embedding map as the graph's last initializer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from engines.errors import ModelError
from engines.torchnets.onnx_weights import ConvWeights, OnnxWeights, copy_into, expect_count, load_conv

LEAKY_SLOPE = 0.2
LATENT_DIM = 512
CROP = 128
INSTANCE_EPS = 1e-5
ENCODER_CONVS = 4
DECODER_CONVS = 4


@dataclass(frozen=True)
class SwapperSpec:
    c1: int
    c2: int
    c3: int
    c4: int
    blocks: int = 6

    def __post_init__(self) -> None:
        if min(self.c1, self.c2, self.c3, self.c4, self.blocks) < 1:
            raise ValueError(f"every swapper width and the block count must be at least 1: {self}")

    def to_dict(self) -> dict[str, Any]:
        return {"arch": "swapper", "c1": self.c1, "c2": self.c2, "c3": self.c3, "c4": self.c4, "blocks": self.blocks}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SwapperSpec:
        return cls(int(data["c1"]), int(data["c2"]), int(data["c3"]), int(data["c4"]), int(data["blocks"]))

    @classmethod
    def divided(cls, divisor: int, blocks: int = 6) -> SwapperSpec:
        """inswapper_128's widths (128/256/512/1024) divided by `divisor`."""
        c1, c2, c3, c4 = (max(1, c // divisor) for c in (128, 256, 512, 1024))
        return cls(c1, c2, c3, c4, blocks)


class StyleBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3)
        self.style1 = nn.Linear(LATENT_DIM, 2 * channels)
        self.conv2 = nn.Conv2d(channels, channels, 3)
        self.style2 = nn.Linear(LATENT_DIM, 2 * channels)

    @staticmethod
    def _adain(h: torch.Tensor, style: torch.Tensor) -> torch.Tensor:
        gamma, beta = style[:, :, None, None].chunk(2, dim=1)
        return F.instance_norm(h, eps=INSTANCE_EPS) * gamma + beta

    def forward(self, x: torch.Tensor, latent: torch.Tensor) -> torch.Tensor:
        h = self.conv1(F.pad(x, (1, 1, 1, 1), mode="reflect"))
        h = F.relu(self._adain(h, self.style1(latent)))
        h = self.conv2(F.pad(h, (1, 1, 1, 1), mode="reflect"))
        return x + self._adain(h, self.style2(latent))


class Swapper(nn.Module):
    """target [N, 3, 128, 128] RGB 0..1 and source latent [N, 512] -> [N, 3, 128, 128] RGB 0..1."""

    arch = "swapper"
    emap: torch.Tensor

    def __init__(self, spec: SwapperSpec) -> None:
        super().__init__()
        self.spec = spec
        c1, c2, c3, c4 = spec.c1, spec.c2, spec.c3, spec.c4
        self.enc1 = nn.Conv2d(3, c1, 7)
        self.enc2 = nn.Conv2d(c1, c2, 3, padding=1)
        self.enc3 = nn.Conv2d(c2, c3, 3, stride=2, padding=1)
        self.enc4 = nn.Conv2d(c3, c4, 3, stride=2, padding=1)
        self.blocks = nn.ModuleList(StyleBlock(c4) for _ in range(spec.blocks))
        self.dec1 = nn.Conv2d(c4, c3, 3, padding=1)
        self.dec2 = nn.Conv2d(c3, c2, 3, padding=1)
        self.dec3 = nn.Conv2d(c2, c1, 3, padding=1)
        self.out = nn.Conv2d(c1, 3, 7)
        self.register_buffer("emap", torch.eye(LATENT_DIM))

    def block_list(self) -> list[StyleBlock]:
        return [cast(StyleBlock, block) for block in self.blocks]

    def convs_in_order(self) -> list[nn.Conv2d]:
        convs = [self.enc1, self.enc2, self.enc3, self.enc4]
        for block in self.block_list():
            convs += [block.conv1, block.conv2]
        return [*convs, self.dec1, self.dec2, self.dec3, self.out]

    def styles_in_order(self) -> list[nn.Linear]:
        styles: list[nn.Linear] = []
        for block in self.block_list():
            styles += [block.style1, block.style2]
        return styles

    def forward(self, target: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        lrelu = F.leaky_relu
        x = lrelu(self.enc1(F.pad(target, (3, 3, 3, 3), mode="reflect")), LEAKY_SLOPE)
        x = lrelu(self.enc2(x), LEAKY_SLOPE)
        x = lrelu(self.enc3(x), LEAKY_SLOPE)
        x = lrelu(self.enc4(x), LEAKY_SLOPE)
        for block in self.block_list():
            x = block(x, source)
        x = lrelu(self.dec1(F.interpolate(x, scale_factor=2.0, mode="nearest")), LEAKY_SLOPE)
        x = lrelu(self.dec2(F.interpolate(x, scale_factor=2.0, mode="nearest")), LEAKY_SLOPE)
        x = lrelu(self.dec3(x), LEAKY_SLOPE)
        x = self.out(F.pad(x, (3, 3, 3, 3), mode="reflect"))
        return (torch.tanh(x) + 1.0) * 0.5

    @classmethod
    def from_onnx(cls, path: Path | str) -> Swapper:
        """Rebuild a network of this layout (a reference swapper or an exported student) from its ONNX file."""
        weights = OnnxWeights.load(path)
        source = weights.source
        convs = weights.convs()
        blocks = (len(convs) - ENCODER_CONVS - DECODER_CONVS) // 2
        if blocks < 1 or len(convs) != ENCODER_CONVS + DECODER_CONVS + 2 * blocks:
            raise ModelError(f"{source} does not have the reference swapper's layout ({len(convs)} convolutions)")
        _check_layout(convs, blocks, source)
        spec = SwapperSpec(
            convs[0].out_channels, convs[1].out_channels, convs[2].out_channels, convs[3].out_channels, blocks
        )
        gemms = weights.nodes_of("Gemm")
        expect_count(gemms, 2 * blocks, "style projections", source)
        net = cls(spec)
        for i, (module, found) in enumerate(zip(net.convs_in_order(), convs, strict=True)):
            load_conv(module, found, f"{source} conv {i} ({found.name})")
        for i, (linear, node) in enumerate(zip(net.styles_in_order(), gemms, strict=True)):
            attrs = {a.name: a.i for a in node.attribute}
            if attrs.get("transB", 0) != 1 or attrs.get("transA", 0) != 0 or node.input[0] != "source":
                raise ModelError(f"{source}: style projection {node.name!r} is not source @ W^T + b")
            copy_into(linear.weight, weights.array(node.input[1]), f"{source} style {i} weight")
            copy_into(linear.bias, weights.array(node.input[2]), f"{source} style {i} bias")
        emap = weights.last_initializer()
        if emap.shape != (LATENT_DIM, LATENT_DIM):
            raise ModelError(f"{source}: the last initializer is {emap.shape}, expected emap {LATENT_DIM}x{LATENT_DIM}")
        copy_into(net.emap, emap, f"{source} emap")
        return net.eval()


def _check_layout(convs: list[ConvWeights], blocks: int, source: str) -> None:
    """Kernel, stride and explicit padding of every convolution, as the reference builder makes them."""
    expected = [(7, 1, 0), (3, 1, 1), (3, 2, 1), (3, 2, 1)] + [(3, 1, 0)] * (2 * blocks)
    expected += [(3, 1, 1)] * 3 + [(7, 1, 0)]
    for conv, (kernel, stride, pad) in zip(convs, expected, strict=True):
        if (conv.kernel, conv.stride, conv.pad, conv.group) != (kernel, stride, pad, 1):
            raise ModelError(
                f"{source}: conv {conv.name} is {conv.kernel}x{conv.kernel}/s{conv.stride}/p{conv.pad}, "
                f"the reference layout has {kernel}x{kernel}/s{stride}/p{pad} there"
            )
