"""SRVGGNetCompact, the network of Real-ESRGAN's animevideov3 models, in torch.

A plain chain of 3x3 convolutions with per-channel PReLU, a last convolution to 3*s*s channels, a
pixel shuffle (ONNX DepthToSpace, CRD order) and a nearest-neighbour upsampled copy of the input added on
top. The ncnn x2 and x3 files run the x4 body and then resize the result by 0.5 or 0.75 with bicubic
interpolation (half-pixel centres, a = -0.75); `out_scale` carries that.

Every layer may have its own width, so channel-pruned networks are the same class with other widths.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import onnx
import torch
import torch.nn.functional as F
from torch import nn

from engines.errors import ModelError
from engines.torchnets.onnx_weights import OnnxWeights, copy_into, expect_count, load_conv


@dataclass(frozen=True)
class SRVGGSpec:
    """widths: output channels of the first convolution and of every body convolution, in order.
    shuffle: the pixel-shuffle factor. out_scale: a final bicubic resize factor, or None."""

    widths: tuple[int, ...]
    shuffle: int = 4
    out_scale: float | None = None

    def __post_init__(self) -> None:
        if not self.widths or min(self.widths) < 1:
            raise ValueError(f"every SRVGG width must be at least 1, got {self.widths}")
        if self.shuffle < 1:
            raise ValueError("the pixel-shuffle factor must be at least 1")

    @property
    def scale(self) -> float:
        return self.shuffle * (self.out_scale or 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"arch": "srvgg", "widths": list(self.widths), "shuffle": self.shuffle, "out_scale": self.out_scale}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SRVGGSpec:
        return cls(tuple(int(w) for w in data["widths"]), int(data["shuffle"]), data.get("out_scale"))

    @classmethod
    def compact(cls, num_feat: int = 64, num_conv: int = 16, shuffle: int = 4) -> SRVGGSpec:
        """The published layout: a first conv and `num_conv` body convs, all `num_feat` wide."""
        return cls((num_feat,) * (num_conv + 1), shuffle)


class SRVGG(nn.Module):
    """Input [N, 3, H, W] RGB 0..1, output [N, 3, s*H, s*W] (not clamped)."""

    arch = "srvgg"

    def __init__(self, spec: SRVGGSpec) -> None:
        super().__init__()
        self.spec = spec
        c_in = 3
        convs, acts = [], []
        for width in spec.widths:
            convs.append(nn.Conv2d(c_in, width, 3, padding=1))
            acts.append(nn.PReLU(width))
            c_in = width
        self.convs = nn.ModuleList(convs)
        self.acts = nn.ModuleList(acts)
        self.last = nn.Conv2d(c_in, 3 * spec.shuffle * spec.shuffle, 3, padding=1)

    def body(self) -> list[tuple[nn.Conv2d, nn.PReLU]]:
        """(convolution, PReLU) pairs of the body, in order."""
        return [(cast(nn.Conv2d, c), cast(nn.PReLU, a)) for c, a in zip(self.convs, self.acts, strict=True)]

    def convs_in_order(self) -> list[nn.Conv2d]:
        return [conv for conv, _ in self.body()] + [self.last]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for conv, act in self.body():
            h = act(conv(h))
        out = F.pixel_shuffle(self.last(h), self.spec.shuffle)
        out = out + F.interpolate(x, scale_factor=float(self.spec.shuffle), mode="nearest")
        if self.spec.out_scale is not None:
            out = F.interpolate(out, scale_factor=self.spec.out_scale, mode="bicubic", align_corners=False)
        return out

    @classmethod
    def from_onnx(cls, path: Path | str) -> SRVGG:
        """Rebuild the network (widths included) from an imported or exported ONNX file."""
        weights = OnnxWeights.load(path)
        spec = _spec_from_graph(weights)
        net = cls(spec)
        convs = weights.convs()
        slopes = weights.second_inputs("PRelu")
        expect_count(slopes, len(spec.widths), "PRelu slopes", weights.source)
        for i, (conv, act) in enumerate(net.body()):
            load_conv(conv, convs[i], f"{weights.source} conv {i}")
            copy_into(act.weight, slopes[i], f"{weights.source} PReLU {i}")
        load_conv(net.last, convs[-1], f"{weights.source} last conv")
        return net.eval()


def _spec_from_graph(weights: OnnxWeights) -> SRVGGSpec:
    source = weights.source
    ops = weights.op_types()
    convs = weights.convs()
    n = len(convs) - 1
    if n < 1:
        raise ModelError(f"{source} is not an SRVGG network: it has {len(convs)} convolutions")
    head = ["Conv", "PRelu"] * n + ["Conv", "DepthToSpace", "Resize", "Add"]
    if ops[: len(head)] != head or ops[len(head) :] not in ([], ["Resize"]):
        raise ModelError(f"{source} is not an SRVGG network (Conv/PRelu chain, DepthToSpace, upsampled skip)")
    for conv in convs:
        if conv.kernel != 3 or conv.pad != 1 or conv.stride != 1 or conv.group != 1:
            raise ModelError(f"{source}: SRVGG convolutions are 3x3, stride 1, pad 1; {conv.name} is not")
    d2s = weights.nodes_of("DepthToSpace")[0]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in d2s.attribute}
    shuffle = int(attrs["blocksize"])
    if attrs.get("mode", b"DCR") != b"CRD":
        raise ModelError(f"{source}: DepthToSpace must use CRD order (torch's pixel shuffle)")
    if convs[-1].out_channels != 3 * shuffle * shuffle:
        raise ModelError(f"{source}: the last conv has {convs[-1].out_channels} outputs, expected {3 * shuffle**2}")
    resizes = weights.nodes_of("Resize")
    nearest = _resize_attrs(weights, resizes[0])
    if not _is_nearest(nearest, float(shuffle)):
        raise ModelError(f"{source}: the input skip must be a nearest (floor, asymmetric) x{shuffle} resize")
    out_scale = None
    if len(resizes) == 2:
        final = _resize_attrs(weights, resizes[1])
        if final["mode"] != "cubic" or final["transform"] != "half_pixel" or final["cubic_a"] != -0.75:
            raise ModelError(f"{source}: the final resize must be bicubic (a=-0.75) with half-pixel centres")
        out_scale = float(final["scale"])
    widths = tuple(conv.out_channels for conv in convs[:-1])
    return SRVGGSpec(widths, shuffle, out_scale)


def _resize_attrs(weights: OnnxWeights, node: onnx.NodeProto) -> dict[str, Any]:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if len(node.input) < 3 or not node.input[2]:
        raise ModelError(f"{weights.source}: Resize {node.name!r} must give scales")
    scales = weights.array(node.input[2]).astype(float).ravel()
    if len(scales) != 4 or scales[0] != 1 or scales[1] != 1 or scales[2] != scales[3]:
        raise ModelError(f"{weights.source}: Resize {node.name!r} must scale H and W alike, got {list(scales)}")
    return {
        "mode": attrs.get("mode", b"nearest").decode(),
        "transform": attrs.get("coordinate_transformation_mode", b"half_pixel").decode(),
        "cubic_a": float(attrs.get("cubic_coeff_a", -0.75)),
        "nearest_mode": attrs.get("nearest_mode", b"round_prefer_floor").decode(),
        "scale": float(scales[2]),
    }


def _is_nearest(attrs: dict[str, Any], scale: float) -> bool:
    """Whether a Resize is torch's `interpolate(mode="nearest")` at an integer factor."""
    return (
        attrs["mode"] == "nearest"
        and attrs["transform"] == "asymmetric"
        and attrs["nearest_mode"] == "floor"
        and attrs["scale"] == scale
    )
