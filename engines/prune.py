"""Structured channel pruning of the super-resolution networks (RRDBNet x4plus, SRVGG).

Whole output channels of convolutions are removed, together with the matching input channels of every
convolution that reads them, and the result is a smaller dense network of the same class (not a mask).

How channels are tied
  A network is described as a list of convolution *slots* (`ConvSlot`), each reading and writing a
  concatenation of named channel *groups*. Removing channel c of a group removes it from every slot that
  writes the group (weight rows, bias entries, PReLU slopes) and from every slot that reads it (weight
  columns, at the group's offset inside the concatenation). So:
  - RRDBNet: the trunk group is written by conv_first, the fifth conv of every residual dense block and
    conv_body (residual additions add those channels one to one) and read by every dense-block conv (the
    block input is the first part of each concatenation), conv_body and conv_up1. Each growth conv k of
    a dense block is its own group, read by convs k+1..5 of that block at its concat offset.
  - SRVGG: each body conv is a group, read by the next conv; its PReLU slopes go with it. The last conv
    keeps its 3*s*s outputs (the pixel shuffle needs them) and loses the removed inputs.

Ranking and the masked reference
  Channels are ranked by the L1 norm of their filters (for a tied group, the sum over its writers of the
  norm divided by that writer's mean filter norm) and the smallest are removed. Without bias
  compensation, the pruned network computes exactly what the unpruned one computes when, for every removed
  channel, the weights AND the bias of every writer are zeroed (`masked`): the channel is then identically
  zero (LeakyReLU(0) = PReLU(0) = 0 and 0 * 0.2 + 0 = 0 through the residual paths), so dropping it changes
  no sum. Zeroing the weights alone is not equivalent: the channel would still carry act(bias), a constant
  map that feeds the readers (and, through zero padding, not even as a constant at the borders).

Bias compensation (optional, on by default in `prune_network`)
  A removed channel is replaced, at every convolution that reads it, by its mean over calibration data
  (measured on the unpruned network): reader.bias += sum_{kh,kw} W[:, c] * mean_c. This is exact for a
  channel that is constant away from the borders and a good first-order fix otherwise.

Per-layer ratios
  `sensitivity_scan` prunes one *unit* (a group, or a set of like groups: RRDBNet's growth convs k of the
  first, middle and last third of the blocks) at a time, at several ratios, and measures the output
  against the unpruned network on held-out crops (PSNR, and MSE used for allocation) and against ground
  truth when given. `allocate` then picks per-unit ratios greedily: each step raises the ratio of the unit
  that adds the least interpolated MSE per removed unit of budget (channels, parameters or MACs) until
  the target fraction is removed.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from engines.errors import ModelError
from engines.torchnets.rrdbnet import GROWTH_CONVS, RRDBNet, RRDBSpec, as_growth
from engines.torchnets.srvgg import SRVGG, SRVGGSpec

Segment = tuple[str | None, int]  # (group name, width); None marks fixed channels (image RGB)
Budget = Literal["channels", "params", "macs"]
Keep = dict[str, np.ndarray]
PrunableNet = RRDBNet | SRVGG

DEFAULT_RATIOS = (0.25, 0.5, 0.75)
_THIRDS = ("head", "middle", "tail")


@dataclass(frozen=True)
class ConvSlot:
    """One convolution: the groups its input and output concatenate, and its output pixels per input
    pixel of the network (4 after one x2 upsampling, 16 after two)."""

    inputs: tuple[Segment, ...]
    outputs: tuple[Segment, ...]
    kernel: int = 3
    area: int = 1

    @property
    def in_width(self) -> int:
        return sum(w for _, w in self.inputs)

    @property
    def out_width(self) -> int:
        return sum(w for _, w in self.outputs)


@dataclass(frozen=True)
class ChannelGroup:
    name: str
    width: int
    unit: str


@dataclass(frozen=True)
class Layout:
    slots: tuple[ConvSlot, ...]
    groups: tuple[ChannelGroup, ...]

    def group(self, name: str) -> ChannelGroup:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)

    def units(self) -> list[str]:
        return list(dict.fromkeys(g.unit for g in self.groups))

    def widths(self) -> dict[str, int]:
        return {g.name: g.width for g in self.groups}


def layout(net: nn.Module) -> Layout:
    """The slots and channel groups of a prunable network (see the module docstring)."""
    if isinstance(net, RRDBNet):
        return _rrdb_layout(net.spec)
    if isinstance(net, SRVGG):
        return _srvgg_layout(net.spec)
    raise ModelError(f"structured pruning supports RRDBNet and SRVGG networks, not {type(net).__name__}")


def _rrdb_layout(spec: RRDBSpec) -> Layout:
    trunk: Segment = ("trunk", spec.trunk)
    slots = [ConvSlot(((None, 3),), (trunk,))]
    groups = [ChannelGroup("trunk", spec.trunk, "trunk")]
    n_rdb = len(spec.growth)
    for i, growth in enumerate(spec.growth):
        third = _THIRDS[min(2, 3 * i // n_rdb)]
        segments: list[Segment] = [trunk]
        for k, width in enumerate(growth):
            name = f"rdb{i}.g{k + 1}"
            groups.append(ChannelGroup(name, width, f"{third}.g{k + 1}"))
            slots.append(ConvSlot(tuple(segments), ((name, width),)))
            segments.append((name, width))
        slots.append(ConvSlot(tuple(segments), (trunk,)))
    up1, up2, hr = ("up1", spec.up1), ("up2", spec.up2), ("hr", spec.hr)
    slots += [
        ConvSlot((trunk,), (trunk,)),
        ConvSlot((trunk,), (up1,), area=4),
        ConvSlot((up1,), (up2,), area=16),
        ConvSlot((up2,), (hr,), area=16),
        ConvSlot((hr,), ((None, 3),), area=16),
    ]
    groups += [ChannelGroup(name, width, name) for name, width in (up1, up2, hr)]
    return Layout(tuple(slots), tuple(groups))


def _srvgg_layout(spec: SRVGGSpec) -> Layout:
    slots, groups = [], []
    previous: Segment = (None, 3)
    for j, width in enumerate(spec.widths):
        name = f"conv{j}"
        groups.append(ChannelGroup(name, width, name))
        slots.append(ConvSlot((previous,), ((name, width),)))
        previous = (name, width)
    slots.append(ConvSlot((previous,), ((None, 3 * spec.shuffle**2),)))
    return Layout(tuple(slots), tuple(groups))


def _convs(net: PrunableNet) -> list[nn.Conv2d]:
    return net.convs_in_order()


def rebuild(net: PrunableNet, widths: Mapping[str, int]) -> PrunableNet:
    """A fresh (untrained) network of the same class with the given group widths."""
    if isinstance(net, RRDBNet):
        spec = net.spec
        growth = tuple(
            as_growth([widths[f"rdb{i}.g{k + 1}"] for k in range(GROWTH_CONVS)]) for i in range(len(spec.growth))
        )
        return RRDBNet(RRDBSpec(widths["trunk"], growth, widths["up1"], widths["up2"], widths["hr"]))
    widths_list = tuple(widths[f"conv{j}"] for j in range(len(net.spec.widths)))
    return SRVGG(SRVGGSpec(widths_list, net.spec.shuffle, net.spec.out_scale))


# -- counting -------------------------------------------------------------------------------------------


def _resolved(segments: Iterable[Segment], widths: Mapping[str, int]) -> int:
    return sum(w if name is None else widths[name] for name, w in segments)


def count_cost(lay: Layout, widths: Mapping[str, int] | None = None) -> tuple[int, int]:
    """(parameters, MACs per input pixel) of the network with the given group widths (default: as is)."""
    widths = lay.widths() if widths is None else widths
    params = macs = 0
    for slot in lay.slots:
        c_in, c_out = _resolved(slot.inputs, widths), _resolved(slot.outputs, widths)
        per_pixel = c_in * c_out * slot.kernel * slot.kernel
        params += per_pixel + c_out
        macs += per_pixel * slot.area
    if any(name.startswith("conv") for name in widths):  # SRVGG: PReLU slopes
        params += sum(widths[g.name] for g in lay.groups)
    return params, macs


def budget_value(lay: Layout, widths: Mapping[str, int], budget: Budget) -> int:
    if budget == "channels":
        return sum(widths[g.name] for g in lay.groups)
    params, macs = count_cost(lay, widths)
    return params if budget == "params" else macs


# -- ranking, masking, pruning --------------------------------------------------------------------------


def _indices(segments: Iterable[Segment], keep: Mapping[str, np.ndarray], *, removed: bool = False) -> np.ndarray:
    parts, offset = [], 0
    for name, width in segments:
        if name is None:
            chosen = np.zeros(0, np.int64) if removed else np.arange(width)
        else:
            kept = keep[name]
            chosen = np.setdiff1d(np.arange(width), kept) if removed else kept
        parts.append(offset + np.asarray(chosen, np.int64))
        offset += width
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def l1_scores(net: PrunableNet) -> dict[str, np.ndarray]:
    """Per-channel importance of every group: the L1 norm of each output filter, divided by the writer's
    mean filter norm, summed over the group's writers."""
    lay = layout(net)
    scores = {g.name: np.zeros(g.width, np.float64) for g in lay.groups}
    for slot, conv in zip(lay.slots, _convs(net), strict=True):
        norms = conv.weight.detach().abs().sum(dim=(1, 2, 3)).double().numpy()
        offset = 0
        for name, width in slot.outputs:
            if name is not None:
                part = norms[offset : offset + width]
                scores[name] += part / max(float(part.mean()), 1e-12)
            offset += width
    return scores


def kept_count(width: int, ratio: float) -> int:
    return max(1, min(width, round(width * (1.0 - ratio))))


def keep_for_ratios(
    net: PrunableNet, ratios: Mapping[str, float], scores: Mapping[str, np.ndarray] | None = None
) -> Keep:
    """Channels kept in every group: the highest-scoring `1 - ratio` of it (every channel of a group not in
    `ratios`), as sorted index arrays."""
    lay = layout(net)
    scores = l1_scores(net) if scores is None else scores
    keep: Keep = {}
    for g in lay.groups:
        n = kept_count(g.width, ratios.get(g.name, 0.0))
        order = np.argsort(-scores[g.name], kind="stable")
        keep[g.name] = np.sort(order[:n]).astype(np.int64)
    return keep


def masked(net: PrunableNet, keep: Mapping[str, np.ndarray]) -> PrunableNet:
    """A copy of the unpruned network in which every removed channel's writers have zero weights AND zero
    bias: the exact functional equivalent of `prune(net, keep)` without compensation."""
    out = copy.deepcopy(net)
    lay = layout(out)
    with torch.no_grad():
        for slot, conv in zip(lay.slots, _convs(out), strict=True):
            gone = torch.from_numpy(_indices(slot.outputs, keep, removed=True))
            conv.weight[gone] = 0.0
            if conv.bias is not None:
                conv.bias[gone] = 0.0
    return out


def input_means(net: PrunableNet, inputs: np.ndarray, batch: int = 4) -> list[torch.Tensor]:
    """Mean of every input channel of every convolution (slot order) over `inputs` [N, 3, H, W]."""
    convs = _convs(net)
    sums = [torch.zeros(conv.in_channels, dtype=torch.float64) for conv in convs]
    counts = [0] * len(convs)

    def hook(index: int) -> Callable[[nn.Module, tuple[torch.Tensor, ...]], None]:
        def record(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            x = args[0].detach()
            sums[index] += x.double().sum(dim=(0, 2, 3))
            counts[index] += x.shape[0] * x.shape[2] * x.shape[3]

        return record

    handles = [conv.register_forward_pre_hook(hook(i)) for i, conv in enumerate(convs)]
    try:
        run_net(net, inputs, batch=batch)
    finally:
        for handle in handles:
            handle.remove()
    return [(s / max(n, 1)).float() for s, n in zip(sums, counts, strict=True)]


def prune(net: PrunableNet, keep: Mapping[str, np.ndarray], means: Sequence[torch.Tensor] | None = None) -> PrunableNet:
    """The smaller network keeping, in every group, the channels `keep[group]` (sorted indices). With
    `means` (from `input_means`), removed inputs are folded into the readers' biases."""
    lay = layout(net)
    for g in lay.groups:
        kept = np.asarray(keep[g.name])
        if kept.size == 0 or kept.min() < 0 or kept.max() >= g.width or np.any(np.diff(kept) <= 0):
            raise ValueError(f"keep[{g.name!r}] must be sorted distinct indices in [0, {g.width}), at least one")
    new = rebuild(net, {g.name: len(keep[g.name]) for g in lay.groups})
    with torch.no_grad():
        for i, (slot, src, dst) in enumerate(zip(lay.slots, _convs(net), _convs(new), strict=True)):
            out_idx = torch.from_numpy(_indices(slot.outputs, keep))
            in_idx = torch.from_numpy(_indices(slot.inputs, keep))
            weight = src.weight[out_idx]
            dst.weight.copy_(weight[:, in_idx])
            bias = src.bias[out_idx].clone() if src.bias is not None else None
            if means is not None and bias is not None:
                gone = torch.from_numpy(_indices(slot.inputs, keep, removed=True))
                if gone.numel():
                    bias += weight[:, gone].sum(dim=(2, 3)) @ means[i][gone].to(weight.dtype)
            if bias is not None and dst.bias is not None:
                dst.bias.copy_(bias)
        if isinstance(net, SRVGG) and isinstance(new, SRVGG):
            for j, ((_, src_act), (_, dst_act)) in enumerate(zip(net.body(), new.body(), strict=True)):
                dst_act.weight.copy_(src_act.weight[torch.from_numpy(keep[f"conv{j}"])])
    return new.eval()


# -- running --------------------------------------------------------------------------------------------


def run_net(net: nn.Module, inputs: np.ndarray, batch: int = 4) -> np.ndarray:
    """Forward `inputs` [N, 3, H, W] in batches without gradients (channels-last: much faster on CPU)."""
    net.eval()
    outs = []
    with torch.no_grad():
        for start in range(0, len(inputs), batch):
            x = torch.from_numpy(np.ascontiguousarray(inputs[start : start + batch]))
            outs.append(net(x.contiguous(memory_format=torch.channels_last)).contiguous().numpy())
    return np.concatenate(outs)


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two 0..1 images (both clipped to 0..1), over everything at once."""
    mse = float(np.mean((np.clip(a, 0, 1).astype(np.float64) - np.clip(b, 0, 1)) ** 2))
    return 10.0 * math.log10(1.0 / max(mse, 1e-12))


# -- sensitivity and allocation -------------------------------------------------------------------------


@dataclass(frozen=True)
class SensitivityPoint:
    unit: str
    ratio: float
    channels_removed: int
    mse_vs_ref: float
    psnr_vs_ref: float
    psnr_vs_gt: float | None


def sensitivity_scan(
    net: PrunableNet,
    inputs: np.ndarray,
    *,
    ratios: Sequence[float] = DEFAULT_RATIOS,
    ground_truth: np.ndarray | None = None,
    means: Sequence[torch.Tensor] | None = None,
    units: Sequence[str] | None = None,
    batch: int = 4,
    progress: bool = True,
) -> list[SensitivityPoint]:
    """Prune each unit alone at each ratio and measure the output on `inputs` against the unpruned
    network's (and against `ground_truth`, when given)."""
    lay = layout(net)
    scores = l1_scores(net)
    reference = run_net(net, inputs, batch)
    chosen = list(units) if units is not None else lay.units()
    points = []
    jobs = [(u, r) for u in chosen for r in ratios]
    for unit, ratio in tqdm(jobs, desc="sensitivity", disable=not progress, leave=False):
        members = [g for g in lay.groups if g.unit == unit]
        if not members:
            raise ValueError(f"no channel group belongs to unit {unit!r}")
        keep = keep_for_ratios(net, {g.name: ratio for g in members}, scores)
        removed = sum(g.width - len(keep[g.name]) for g in members)
        out = run_net(prune(net, keep, means), inputs, batch)
        mse = float(np.mean((np.clip(out, 0, 1).astype(np.float64) - np.clip(reference, 0, 1)) ** 2))
        gt = None if ground_truth is None else psnr(out, ground_truth)
        points.append(SensitivityPoint(unit, float(ratio), removed, mse, psnr(out, reference), gt))
    return points


def _damage(points: Sequence[SensitivityPoint], unit: str, ratio: float) -> float:
    """MSE against the unpruned output at `ratio`, interpolated linearly through (0, 0) and the scan."""
    curve = sorted((p.ratio, p.mse_vs_ref) for p in points if p.unit == unit)
    xs = [0.0] + [r for r, _ in curve]
    ys = [0.0] + [m for _, m in curve]
    return float(np.interp(ratio, xs, ys))


@dataclass
class PrunePlan:
    """Ratios per unit and widths per group, with the cost before and after (per input pixel)."""

    target: float
    budget: str
    unit_ratios: dict[str, float]
    widths_before: dict[str, int]
    widths_after: dict[str, int]
    params_before: int
    params_after: int
    macs_per_pixel_before: int
    macs_per_pixel_after: int
    removed_fraction: float
    predicted_mse: float
    scan: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def allocate(
    net: PrunableNet,
    points: Sequence[SensitivityPoint],
    target: float,
    *,
    budget: Budget = "channels",
    step: float = 0.05,
) -> PrunePlan:
    """Per-unit ratios that remove at least `target` of the budget (fraction of channels, parameters or
    MACs), raising one unit by `step` at a time where the scan predicts the least added MSE per budget
    removed. Ratios never exceed the largest ratio scanned."""
    if not 0.0 < target < 1.0:
        raise ValueError("the pruning target must be a fraction between 0 and 1")
    lay = layout(net)
    units = sorted({p.unit for p in points})
    missing = set(lay.units()) - set(units)
    if missing:
        raise ValueError(f"the sensitivity scan has no points for units {sorted(missing)}")
    ceiling = max(p.ratio for p in points)
    ratios = dict.fromkeys(units, 0.0)
    total = budget_value(lay, lay.widths(), budget)

    def widths_for(r: Mapping[str, float]) -> dict[str, int]:
        return {g.name: kept_count(g.width, r[g.unit]) for g in lay.groups}

    current = total
    while (total - current) / total < target:
        # (added MSE per budget removed, added MSE, unit); a step that removes nothing yet costs infinity
        candidates: list[tuple[float, float, str]] = []
        for unit in units:
            nxt = min(ceiling, ratios[unit] + step)
            if nxt <= ratios[unit] + 1e-9:
                continue
            trial = {**ratios, unit: nxt}
            saved = current - budget_value(lay, widths_for(trial), budget)
            added = _damage(points, unit, nxt) - _damage(points, unit, ratios[unit])
            candidates.append((added / saved if saved > 0 else math.inf, added, unit))
        if not candidates:
            raise ModelError(
                f"cannot remove {target:.0%} of the {budget} with ratios up to {ceiling:.0%}: scan higher ratios"
            )
        _, _, unit = min(candidates)
        ratios[unit] = min(ceiling, ratios[unit] + step)
        current = budget_value(lay, widths_for(ratios), budget)

    after = widths_for(ratios)
    params_before, macs_before = count_cost(lay)
    params_after, macs_after = count_cost(lay, after)
    return PrunePlan(
        target=target,
        budget=budget,
        unit_ratios={u: round(r, 4) for u, r in ratios.items()},
        widths_before=lay.widths(),
        widths_after=after,
        params_before=params_before,
        params_after=params_after,
        macs_per_pixel_before=macs_before,
        macs_per_pixel_after=macs_after,
        removed_fraction=(total - current) / total,
        predicted_mse=sum(_damage(points, u, r) for u, r in ratios.items()),
        scan=[asdict(p) for p in points],
    )


def group_ratios(net: PrunableNet, plan: PrunePlan) -> dict[str, float]:
    return {g.name: plan.unit_ratios.get(g.unit, 0.0) for g in layout(net).groups}


@dataclass
class PruneResult:
    net: PrunableNet
    plan: PrunePlan
    keep: Keep


def prune_network(
    net: PrunableNet,
    heldout: np.ndarray,
    *,
    target: float = 0.3,
    budget: Budget = "channels",
    ratios: Sequence[float] = DEFAULT_RATIOS,
    heldout_gt: np.ndarray | None = None,
    calibration: np.ndarray | None = None,
    batch: int = 4,
    progress: bool = True,
) -> PruneResult:
    """Scan, allocate and prune: the smaller network, its plan and the kept channels.

    `heldout` [N, 3, h, w] are the crops the sensitivity is measured on; `calibration` (training crops),
    when given, switches on bias compensation with channel means measured on them."""
    means = input_means(net, calibration, batch) if calibration is not None else None
    points = sensitivity_scan(
        net, heldout, ratios=ratios, ground_truth=heldout_gt, means=means, batch=batch, progress=progress
    )
    plan = allocate(net, points, target, budget=budget)
    keep = keep_for_ratios(net, group_ratios(net, plan))
    return PruneResult(prune(net, keep, means), plan, keep)
