"""RRDBNet, the network of Real-ESRGAN x4plus, in torch.

Layout (as in the imported ONNX graph): conv_first; `num_blocks` residual-in-residual dense blocks
(RRDB), each three residual dense blocks (RDB) of five 3x3 convolutions where convolution k reads the
concatenation of the block input and every earlier output (the first four followed by LeakyReLU 0.2, the
fifth giving back the trunk width, added to the block input after scaling by 0.2); each RRDB's output is
scaled by 0.2 and added to its input; conv_body, added to conv_first's output; then two nearest x2
upsamplings each followed by a convolution and LeakyReLU, conv_hr with LeakyReLU and conv_last.

Every convolution may have its own width (`RRDBSpec`), so channel-pruned networks are the same class.
The trunk width is shared by conv_first, every fifth RDB convolution and conv_body, because residual
additions tie those channels together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from engines.errors import ModelError
from engines.torchnets.onnx_weights import OnnxWeights, expect_count, load_conv, scalar_constants

LEAKY_SLOPE = 0.2
RES_SCALE = 0.2
RDB_PER_RRDB = 3
GROWTH_CONVS = 4
CONVS_PER_RDB = GROWTH_CONVS + 1

Growth = tuple[int, int, int, int]


def as_growth(widths: Sequence[int]) -> Growth:
    """Four growth-conv widths as a typed tuple."""
    if len(widths) != GROWTH_CONVS:
        raise ValueError(f"a residual dense block has {GROWTH_CONVS} growth convolutions, got {len(widths)} widths")
    a, b, c, d = (int(w) for w in widths)
    return (a, b, c, d)


@dataclass(frozen=True)
class RRDBSpec:
    """trunk: width shared through the residual additions. growth: the four growth-conv widths of every
    RDB, in forward order (three per RRDB). up1, up2, hr: widths of the upsampling-stage convolutions."""

    trunk: int
    growth: tuple[Growth, ...]
    up1: int
    up2: int
    hr: int

    def __post_init__(self) -> None:
        if len(self.growth) % RDB_PER_RRDB or not self.growth:
            raise ValueError(f"growth needs three entries per RRDB block, got {len(self.growth)}")
        flat = [self.trunk, self.up1, self.up2, self.hr, *(w for g in self.growth for w in g)]
        if min(flat) < 1 or any(len(g) != GROWTH_CONVS for g in self.growth):
            raise ValueError("every RRDBNet width must be at least 1, four growth widths per RDB")

    @property
    def num_blocks(self) -> int:
        return len(self.growth) // RDB_PER_RRDB

    @classmethod
    def standard(cls, num_feat: int = 64, num_grow: int = 32, num_blocks: int = 23) -> RRDBSpec:
        """Real-ESRGAN x4plus: 64 trunk, 32 growth, 23 blocks."""
        growth = (as_growth([num_grow] * GROWTH_CONVS),) * (RDB_PER_RRDB * num_blocks)
        return cls(num_feat, growth, num_feat, num_feat, num_feat)

    def to_dict(self) -> dict[str, Any]:
        return {
            "arch": "rrdbnet",
            "trunk": self.trunk,
            "growth": [list(g) for g in self.growth],
            "up1": self.up1,
            "up2": self.up2,
            "hr": self.hr,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RRDBSpec:
        growth = tuple(as_growth(g) for g in data["growth"])
        return cls(int(data["trunk"]), growth, int(data["up1"]), int(data["up2"]), int(data["hr"]))


def _conv(c_in: int, c_out: int) -> nn.Conv2d:
    return nn.Conv2d(c_in, c_out, 3, padding=1)


class RDB(nn.Module):
    def __init__(self, trunk: int, growth: Growth) -> None:
        super().__init__()
        convs = []
        c_in = trunk
        for width in growth:
            convs.append(_conv(c_in, width))
            c_in += width
        convs.append(_conv(c_in, trunk))
        self.convs = nn.ModuleList(convs)

    def conv_list(self) -> list[nn.Conv2d]:
        return [cast(nn.Conv2d, conv) for conv in self.convs]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        *growth, last = self.conv_list()
        feats = [x]
        for conv in growth:
            feats.append(F.leaky_relu(conv(torch.cat(feats, 1)), LEAKY_SLOPE))
        return last(torch.cat(feats, 1)) * RES_SCALE + x


class RRDB(nn.Module):
    def __init__(self, trunk: int, growth: tuple[Growth, ...]) -> None:
        super().__init__()
        self.rdbs = nn.ModuleList(RDB(trunk, g) for g in growth)

    def rdb_list(self) -> list[RDB]:
        return [cast(RDB, rdb) for rdb in self.rdbs]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for rdb in self.rdb_list():
            out = rdb(out)
        return out * RES_SCALE + x


class RRDBNet(nn.Module):
    """Input [N, 3, H, W] RGB 0..1, output [N, 3, 4H, 4W] (not clamped)."""

    arch = "rrdbnet"
    scale = 4

    def __init__(self, spec: RRDBSpec) -> None:
        super().__init__()
        self.spec = spec
        self.conv_first = _conv(3, spec.trunk)
        self.body = nn.ModuleList(
            RRDB(spec.trunk, spec.growth[RDB_PER_RRDB * b : RDB_PER_RRDB * (b + 1)]) for b in range(spec.num_blocks)
        )
        self.conv_body = _conv(spec.trunk, spec.trunk)
        self.conv_up1 = _conv(spec.trunk, spec.up1)
        self.conv_up2 = _conv(spec.up1, spec.up2)
        self.conv_hr = _conv(spec.up2, spec.hr)
        self.conv_last = _conv(spec.hr, 3)

    def blocks(self) -> list[RRDB]:
        return [cast(RRDB, block) for block in self.body]

    def rdbs(self) -> list[RDB]:
        return [rdb for block in self.blocks() for rdb in block.rdb_list()]

    def convs_in_order(self) -> list[nn.Conv2d]:
        """Every convolution in the order the ONNX graph runs them."""
        convs: list[nn.Conv2d] = [self.conv_first]
        for rdb in self.rdbs():
            convs.extend(rdb.conv_list())
        convs += [self.conv_body, self.conv_up1, self.conv_up2, self.conv_hr, self.conv_last]
        return convs

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        feat = self.conv_first(x)
        body = feat
        for block in self.blocks():
            body = block(body)
        feat = feat + self.conv_body(body)
        feat = F.leaky_relu(self.conv_up1(F.interpolate(feat, scale_factor=2.0, mode="nearest")), LEAKY_SLOPE)
        feat = F.leaky_relu(self.conv_up2(F.interpolate(feat, scale_factor=2.0, mode="nearest")), LEAKY_SLOPE)
        return self.conv_last(F.leaky_relu(self.conv_hr(feat), LEAKY_SLOPE))

    @classmethod
    def from_onnx(cls, path: Path | str) -> RRDBNet:
        """Rebuild the network (widths included) from the imported x4plus file or a pruned export."""
        weights = OnnxWeights.load(path)
        convs = weights.convs()
        source = weights.source
        n_rdb_convs = len(convs) - 6
        if n_rdb_convs <= 0 or n_rdb_convs % (CONVS_PER_RDB * RDB_PER_RRDB):
            raise ModelError(f"{source} is not an RRDBNet: {len(convs)} convolutions")
        n_rdb = n_rdb_convs // CONVS_PER_RDB
        for conv in convs:
            if conv.kernel != 3 or conv.pad != 1 or conv.stride != 1 or conv.group != 1:
                raise ModelError(f"{source}: RRDBNet convolutions are 3x3, stride 1, pad 1; {conv.name} is not")
        if convs[0].in_channels != 3:
            raise ModelError(f"{source}: the first convolution reads {convs[0].in_channels} channels, expected 3")
        coeffs = scalar_constants(weights, "Mul")
        expect_count(coeffs, n_rdb + n_rdb // RDB_PER_RRDB, "residual scales", source)
        if any(abs(c - RES_SCALE) > 1e-7 for c in coeffs):
            raise ModelError(f"{source}: residual scales must all be {RES_SCALE}, got {sorted(set(coeffs))}")
        growth = tuple(
            as_growth([c.out_channels for c in convs[1 + CONVS_PER_RDB * i : CONVS_PER_RDB * (i + 1)]])
            for i in range(n_rdb)
        )
        up1, up2, hr = (c.out_channels for c in convs[-4:-1])
        spec = RRDBSpec(convs[0].out_channels, growth, up1, up2, hr)
        net = cls(spec)
        modules = net.convs_in_order()
        for i, (module, found) in enumerate(zip(modules, convs, strict=True)):
            load_conv(module, found, f"{source} conv {i} ({found.name})")
        return net.eval()
