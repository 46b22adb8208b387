"""Structured pruning: smaller dense networks, exactly equal to the masked unpruned network, with residual
and concatenation paths kept consistent; bias compensation; the sensitivity scan and ratio allocation."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from engines.errors import ModelError
from engines.export import export_verified
from engines.model_cost import model_cost
from engines.prune import (
    SensitivityPoint,
    _indices,
    allocate,
    count_cost,
    group_ratios,
    input_means,
    keep_for_ratios,
    l1_scores,
    layout,
    masked,
    prune,
    psnr,
    run_net,
    sensitivity_scan,
)
from engines.torchnets import SRVGG, RRDBNet, RRDBSpec, SRVGGSpec
from engines.torchnets.rrdbnet import as_growth
from tests.engines.faces import face_batch

torch.set_num_threads(2)


def random_keep(net: SRVGG | RRDBNet, seed: int, least: int = 1) -> dict[str, np.ndarray]:
    """A random, uneven choice of kept channels in every group (at least `least` each)."""
    rng = np.random.default_rng(seed)
    keep = {}
    for g in layout(net).groups:
        n = int(rng.integers(least, g.width + 1))
        keep[g.name] = np.sort(rng.choice(g.width, size=n, replace=False)).astype(np.int64)
    return keep


def small_rrdb() -> RRDBNet:
    torch.manual_seed(0)
    growth = tuple(as_growth([8, 8, 8, 8]) for _ in range(6))
    net = RRDBNet(RRDBSpec(16, growth, 12, 12, 12))
    with torch.no_grad():
        for conv in net.convs_in_order():
            assert conv.bias is not None
            conv.bias.uniform_(-0.2, 0.2)  # non-zero biases: a removed channel's bias must not leak
    return net.eval()


def weights_only_mask(net: SRVGG | RRDBNet, keep: dict[str, np.ndarray]) -> SRVGG | RRDBNet:
    out = copy.deepcopy(net)
    with torch.no_grad():
        for slot, conv in zip(layout(out).slots, out.convs_in_order(), strict=True):
            conv.weight[torch.from_numpy(_indices(slot.outputs, keep, removed=True))] = 0.0
    return out


def test_pruned_srvgg_is_smaller_and_equals_the_masked_network(model: Callable[[str], Path]) -> None:
    net = SRVGG.from_onnx(model("realesr_animevideov3_x4"))
    keep = keep_for_ratios(net, {g.name: 0.3 for g in layout(net).groups})
    pruned = prune(net, keep)
    assert isinstance(pruned, SRVGG)
    assert pruned.spec.widths == (45,) * 17  # round(64 * 0.7)
    assert pruned.last.weight.shape == (48, 45, 3, 3)  # the pixel shuffle keeps its 3*4*4 outputs
    assert all(act.weight.shape == (45,) for _, act in pruned.body())
    n_before = sum(p.numel() for p in net.parameters())
    n_after = sum(p.numel() for p in pruned.parameters())
    assert n_after < 0.55 * n_before
    # Dense weights, not zeros left in place.
    assert all(bool((conv.weight.abs().sum(dim=(1, 2, 3)) > 0).all()) for conv in pruned.convs_in_order())

    x = face_batch(20)
    out = run_net(pruned, x)
    assert float(np.abs(out - run_net(masked(net, keep), x)).max()) <= 1e-5
    # Zeroing the weights alone is NOT the same network: the removed channels still carry PReLU(bias).
    assert float(np.abs(out - run_net(weights_only_mask(net, keep), x)).max()) > 1e-3
    assert psnr(out, run_net(net, x)) < 60  # something was really removed


@pytest.mark.slow
def test_pruned_x4plus_equals_the_masked_network(model: Callable[[str], Path]) -> None:
    net = RRDBNet.from_onnx(model("realesrgan_x4plus"))
    ratios = {g.name: 0.25 for g in layout(net).groups}
    keep = keep_for_ratios(net, ratios)
    pruned = prune(net, keep)
    assert isinstance(pruned, RRDBNet)
    assert pruned.spec.trunk == 48 and pruned.spec.growth[0] == (24, 24, 24, 24)
    x = face_batch(8)[:1]
    out = run_net(pruned, x)
    ref = run_net(masked(net, keep), x)
    assert out.shape == (1, 3, 32, 32)
    assert float(np.abs(out - ref).max()) <= 1e-4


def test_residual_and_concat_paths_stay_consistent() -> None:
    net = small_rrdb()
    keep = random_keep(net, seed=7)
    pruned = prune(net, keep)
    assert isinstance(pruned, RRDBNet)
    trunk = len(keep["trunk"])
    # Every writer of the trunk (conv_first, each block's fifth conv, conv_body) has the same width, and
    # every reader takes it first in its concatenation.
    assert pruned.conv_first.out_channels == pruned.conv_body.out_channels == trunk
    for i, rdb in enumerate(pruned.rdbs()):
        convs = rdb.conv_list()
        widths = [len(keep[f"rdb{i}.g{k + 1}"]) for k in range(4)]
        assert [c.out_channels for c in convs] == [*widths, trunk]
        assert [c.in_channels for c in convs] == [trunk + sum(widths[:k]) for k in range(5)]
    assert pruned.conv_up1.in_channels == trunk
    assert pruned.conv_up2.in_channels == len(keep["up1"])
    # And the kept weights are the right ones: the pruned network is the masked one, exactly.
    x = np.random.default_rng(0).random((2, 3, 9, 11), dtype=np.float32)
    assert float(np.abs(run_net(pruned, x) - run_net(masked(net, keep), x)).max()) <= 1e-5
    assert float(np.abs(run_net(pruned, x) - run_net(weights_only_mask(net, keep), x)).max()) > 1e-3


def test_masking_only_the_trunk_writers_partially_breaks_the_residual_sum() -> None:
    """Why the trunk is one group: zeroing a trunk channel in conv_first alone leaves the channel alive
    (the dense blocks' fifth convs add to it), so it could not be removed."""
    net = small_rrdb()
    full = {g.name: np.arange(g.width) for g in layout(net).groups}
    keep = {**full, "trunk": np.arange(1, 16)}
    partial = copy.deepcopy(net)
    with torch.no_grad():
        partial.conv_first.weight[0] = 0.0
        partial.conv_first.bias[0] = 0.0  # type: ignore[index]
    x = np.random.default_rng(1).random((1, 3, 8, 8), dtype=np.float32)
    gap = float(np.abs(run_net(partial, x) - run_net(prune(net, keep), x)).max())
    assert gap > 1e-3
    assert float(np.abs(run_net(masked(net, keep), x) - run_net(prune(net, keep), x)).max()) <= 1e-5


def test_l1_ranking_keeps_the_largest_filters() -> None:
    torch.manual_seed(0)
    net = SRVGG(SRVGGSpec((10, 12, 10)))
    keep = keep_for_ratios(net, {"conv1": 0.5})
    norms = net.convs_in_order()[1].weight.detach().abs().sum(dim=(1, 2, 3)).numpy()
    assert set(keep["conv1"]) == set(np.argsort(-norms)[:6])
    assert len(keep["conv0"]) == 10 and len(keep["conv2"]) == 10
    scores = l1_scores(net)
    assert np.allclose(scores["conv1"], norms / norms.mean())


def test_bias_compensation_is_exact_for_a_constant_channel() -> None:
    """A channel whose filter is zero is the constant PReLU(bias); folding its mean into the reader's
    bias reproduces the unpruned network exactly, except within the receptive field of the borders."""
    torch.manual_seed(0)
    net = SRVGG(SRVGGSpec((6, 6, 6))).eval()
    with torch.no_grad():
        conv1 = net.convs_in_order()[1]
        conv1.weight[2] = 0.0
        conv1.bias[2] = 0.7  # type: ignore[index]
    keep = {"conv0": np.arange(6), "conv1": np.array([0, 1, 3, 4, 5]), "conv2": np.arange(6)}
    x = np.random.default_rng(2).random((2, 3, 24, 24), dtype=np.float32)
    means = input_means(net, x)
    assert float(means[2][2]) == pytest.approx(0.7, abs=1e-6)
    ref = run_net(net, x)
    # conv2 and two more convolutions each bring the border one low-res pixel closer: 3 px, x4 upscale.
    inner = (slice(None), slice(None), slice(12, -12), slice(12, -12))
    compensated = run_net(prune(net, keep, means), x)
    plain = run_net(prune(net, keep), x)
    assert float(np.abs(compensated - ref)[inner].max()) <= 1e-5
    assert float(np.abs(plain - ref)[inner].max()) > 1e-2
    assert float(np.abs(compensated - ref).max()) > 1e-4  # the borders do differ


def test_count_cost_matches_model_cost_of_the_export(tmp_path: Path) -> None:
    net = small_rrdb()
    keep = random_keep(net, seed=1, least=1)
    pruned = prune(net, keep)
    path = tmp_path / "pruned.onnx"
    export_verified(pruned, path)
    params, macs_per_pixel = count_cost(layout(pruned))
    measured = model_cost(path, input_shapes={"input": [1, 3, 10, 12]})
    assert params == sum(p.numel() for p in pruned.parameters())
    assert measured.macs == macs_per_pixel * 10 * 12
    # The plan's arithmetic (widths only, no network built) agrees with the built network.
    widths = {g: len(k) for g, k in keep.items()}
    assert count_cost(layout(net), widths) == (params, macs_per_pixel)


@pytest.mark.slow
def test_scan_and_allocation_reach_the_target(model: Callable[[str], Path], tmp_path: Path) -> None:
    net = SRVGG.from_onnx(model("realesr_animevideov3_x4"))
    x = face_batch(16)
    units = ["conv0", "conv8", "conv16"]
    points = sensitivity_scan(net, x, ratios=(0.25, 0.5), units=units, ground_truth=None, progress=False)
    assert [(p.unit, p.ratio) for p in points] == [(u, r) for u in units for r in (0.25, 0.5)]
    for unit in units:
        low, high = (p for p in points if p.unit == unit)
        assert low.channels_removed == 16 and high.channels_removed == 32
        assert low.mse_vs_ref > 0 and np.isfinite(low.psnr_vs_ref)
    # Allocation over a scan of every unit, then pruning to the plan.
    all_points = points + [
        SensitivityPoint(g.unit, r, 0, 1.0, 0.0, None)
        for g in layout(net).groups
        if g.unit not in units
        for r in (0.25, 0.5)
    ]
    plan = allocate(net, all_points, 0.2, budget="params")
    assert plan.removed_fraction >= 0.2
    assert plan.params_after <= 0.8 * plan.params_before
    assert all(0.0 <= r <= 0.5 for r in plan.unit_ratios.values())
    pruned = prune(net, keep_for_ratios(net, group_ratios(net, plan)))
    assert sum(p.numel() for p in pruned.parameters()) == plan.params_after


def test_allocation_spends_the_budget_where_it_hurts_least() -> None:
    torch.manual_seed(0)
    net = SRVGG(SRVGGSpec((32, 32, 32)))
    points = []
    for r in (0.25, 0.5, 0.75):
        points += [
            SensitivityPoint("conv0", r, 0, 1e-2 * r, 0.0, None),  # sensitive
            SensitivityPoint("conv1", r, 0, 1e-5 * r, 0.0, None),  # nearly free
            SensitivityPoint("conv2", r, 0, 1e-3 * r, 0.0, None),
        ]
    plan = allocate(net, points, 0.3, budget="channels")
    assert plan.unit_ratios["conv1"] == pytest.approx(0.75)
    assert plan.unit_ratios["conv0"] == 0.0
    assert plan.removed_fraction >= 0.3
    with pytest.raises(ModelError, match="scan higher ratios"):
        allocate(net, points, 0.9)
    with pytest.raises(ValueError, match="no points"):
        allocate(net, [p for p in points if p.unit != "conv2"], 0.3)


def test_pruning_rejects_other_networks_and_bad_keeps() -> None:
    torch.manual_seed(0)
    net = SRVGG(SRVGGSpec((4, 4)))
    with pytest.raises(ModelError, match="RRDBNet and SRVGG"):
        layout(torch.nn.Conv2d(3, 3, 3))
    with pytest.raises(ValueError, match="conv1"):
        prune(net, {"conv0": np.arange(4), "conv1": np.array([], np.int64)})
    with pytest.raises(ValueError, match="conv0"):
        prune(net, {"conv0": np.array([3, 1]), "conv1": np.arange(4)})
