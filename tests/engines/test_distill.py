"""Distillation on real face crops: data split by photo, the loss falls, a stopped run resumes to the same
weights, the swap-student recipe end to end, the report, and the `swapcast engines` commands."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
import torch

from app.commands import engine_tools, engines_group
from app.media.clips import load_sample
from app.pipeline.align import AlignSpec, estimate_matrix, warp_crop
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.swap import InswapperEngine, SwapItem
from app.runtime.onnx import OnnxModel
from engines.distill import (
    Augment,
    Degradation,
    DistillConfig,
    SourceImage,
    SRSet,
    degrade,
    distill,
    load_set,
    make_sr_set,
    mean_loss,
    run_teacher,
    save_set,
    sobel,
    split_by_image,
    sr_train_data,
)
from engines.errors import ModelError
from engines.export import export_verified
from engines.model_cost import model_cost
from engines.report import Variant, build_report
from engines.store import ModelStore
from engines.swap_student import (
    AlignedCrop,
    distill_swapper,
    new_student,
    parameter_count,
    swap_train_data,
    teacher_emap,
)
from engines.torchnets import SRVGG, SRVGGSpec, SwapperSpec

torch.set_num_threads(2)


@pytest.fixture(scope="module")
def sources(detector: RetinaFaceDetector) -> list[SourceImage]:
    """The three sample photos with the faces the detector finds (Tom Hanks's tight crop: the frame)."""
    out = []
    for name in ("t1", "astronaut", "tom_hanks"):
        bgr = load_sample(name)
        boxes = tuple(tuple(float(v) for v in f.box) for f in detector.process([bgr])[0])
        if not boxes:
            boxes = ((0.0, 0.0, float(bgr.shape[1]), float(bgr.shape[0])),)
        out.append(SourceImage(name, np.ascontiguousarray(bgr[:, :, ::-1]), boxes))  # type: ignore[arg-type]
    return out


@pytest.fixture(scope="module")
def sr_data(sources: list[SourceImage], model: Callable[[str], Path]) -> tuple[SRSet, SRSet]:
    """(train, held-out) x4 sets, 12 px inputs, with animevideov3-x4 as a fast teacher."""
    train_photos, heldout_photos = split_by_image(sources, ["astronaut"])
    train = make_sr_set(train_photos, 32, lr_size=12, scale=4, seed=0, augment=Augment(), degradation=Degradation())
    heldout = make_sr_set(heldout_photos, 6, lr_size=12, scale=4, seed=1)
    teacher = model("realesr_animevideov3_x4")
    train.teacher = run_teacher(teacher, {"input": train.lr}, progress=False)
    heldout.teacher = run_teacher(teacher, {"input": heldout.lr}, progress=False)
    return train, heldout


def test_sets_are_split_by_photo_and_degraded(sources: list[SourceImage], sr_data: tuple[SRSet, SRSet]) -> None:
    train, heldout = sr_data
    assert set(train.image_ids) == {"t1", "tom_hanks"} and set(heldout.image_ids) == {"astronaut"}
    assert train.lr.shape == (32, 3, 12, 12) and train.hr.shape == (32, 3, 48, 48)
    assert train.teacher is not None and train.teacher.shape == train.hr.shape
    assert train.lr.min() >= 0.0 and train.lr.max() <= 1.0
    # t1 has six faces: most crops are drawn around them.
    assert len(sources[0].faces) == 6
    # Held-out inputs are clean area downscales of their ground truth.
    hr = np.rint(heldout.hr[0].transpose(1, 2, 0) * 255).astype(np.uint8)
    clean = degrade(hr, 4, np.random.default_rng(0), None)
    assert np.allclose(clean.transpose(2, 0, 1), heldout.lr[0], atol=1e-6)
    # Training inputs are degraded: they differ from the clean downscale of their ground truth.
    diffs = []
    for i in range(8):
        hr_i = np.rint(train.hr[i].transpose(1, 2, 0) * 255).astype(np.uint8)
        diffs.append(np.abs(degrade(hr_i, 4, np.random.default_rng(0), None).transpose(2, 0, 1) - train.lr[i]).mean())
    assert np.mean(diffs) > 0.005
    with pytest.raises(ModelError, match="held-out"):
        split_by_image(sources, ["nobody"])


def test_set_file_round_trip(sr_data: tuple[SRSet, SRSet], tmp_path: Path) -> None:
    train, _ = sr_data
    back = load_set(save_set(tmp_path / "train.npz", train))
    assert np.array_equal(back.lr, train.lr) and np.array_equal(back.image_ids, train.image_ids)
    assert back.teacher is not None and np.array_equal(back.teacher, train.teacher)  # type: ignore[arg-type]


def test_sobel_term_sees_edges_only() -> None:
    flat = torch.full((1, 3, 8, 8), 0.3)
    assert float(sobel(flat).abs().max()) == 0.0
    step = torch.zeros(1, 1, 8, 8)
    step[..., 4:] = 1.0
    response = sobel(step)
    assert response.shape == (1, 2, 6, 6)
    assert float(response[0, 0].abs().max()) > 0.4 and float(response[0, 1].abs().max()) == 0.0


def _student() -> SRVGG:
    torch.manual_seed(0)
    return SRVGG(SRVGGSpec.compact(8, 2))


@pytest.mark.slow
def test_distillation_loss_falls(sr_data: tuple[SRSet, SRSet], tmp_path: Path) -> None:
    train, heldout = sr_data
    config = DistillConfig(steps=40, batch=8, lr=2e-3, checkpoint_every=20)
    data, held = sr_train_data(train), sr_train_data(heldout)
    student = _student()
    before_train, before_held = mean_loss(student, data, config), mean_loss(student, held, config)
    result = distill(student, data, config, tmp_path / "work", progress=False)
    assert len(result.losses) == 40 and result.resumed_from == 0
    assert mean_loss(result.net, data, config) < 0.8 * before_train
    assert mean_loss(result.net, held, config) < 0.9 * before_held  # and on photos it never saw
    assert (tmp_path / "work" / "checkpoint.pt").is_file()


class _Killed(Exception):
    pass


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_weights(sr_data: tuple[SRSet, SRSet], tmp_path: Path) -> None:
    data = sr_train_data(sr_data[0])
    config = DistillConfig(steps=8, batch=4, lr=1e-3, checkpoint_every=2)
    straight = distill(_student(), data, config, tmp_path / "straight", progress=False)

    def kill_after_five(step: int, _loss: float) -> None:
        if step == 5:
            raise _Killed

    with pytest.raises(_Killed):
        distill(_student(), data, config, tmp_path / "resumed", progress=False, on_step=kill_after_five)
    # A fresh process would start from a fresh network: the checkpoint (step 4) must supply everything.
    resumed = distill(_student(), data, config, tmp_path / "resumed", progress=False)
    assert resumed.resumed_from == 4
    assert [s for s, _ in resumed.losses] == list(range(1, 9))
    a, b = straight.net.state_dict(), resumed.net.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert resumed.losses == straight.losses

    with pytest.raises(ModelError, match="another network or configuration"):
        distill(_student(), data, DistillConfig(steps=8, batch=4, lr=5e-4, checkpoint_every=2), tmp_path / "resumed")
    fresh = distill(_student(), data, config, tmp_path / "resumed", resume=False, progress=False)
    assert fresh.resumed_from == 0


@pytest.mark.slow
def test_swap_student_end_to_end(
    detector: RetinaFaceDetector, model: Callable[[str], Path], tmp_path: Path, store: ModelStore
) -> None:
    teacher = model("reference_swapper_narrow")
    spec = AlignSpec("arcface_128", 128)
    crops = []
    for name in ("t1", "astronaut"):
        bgr = load_sample(name)
        for face in detector.process([bgr])[0]:
            crop = warp_crop(bgr, estimate_matrix(face.landmarks, spec), 128)
            crops.append(AlignedCrop(name, np.ascontiguousarray(crop[:, :, ::-1])))
    train = [c for c in crops if c.image_id == "t1"]
    held = [c for c in crops if c.image_id == "astronaut"]
    assert len(train) == 6 and len(held) == 1
    data = swap_train_data(teacher, train, 12, seed=0, progress=False)
    held_data = swap_train_data(teacher, held, 2, seed=1, progress=False, augment=False)
    config = DistillConfig(steps=20, batch=2, lr=3e-3, alpha=0.0, checkpoint_every=10)
    student_spec = SwapperSpec(4, 8, 16, 32, blocks=2)
    untrained = new_student(student_spec, teacher_emap(teacher), seed=config.seed)  # the student's start
    result = distill_swapper(teacher, data, tmp_path, spec=student_spec, config=config, progress=False)
    assert result.teacher_params is not None and parameter_count(result.net) < 0.5 * result.teacher_params
    losses = [v for _, v in result.result.losses]
    assert np.mean(losses[-4:]) < 0.8 * np.mean(losses[:4])
    assert mean_loss(result.net, held_data, config) < mean_loss(untrained, held_data, config)

    # The inswapper contract, emap included, so the pipeline's engine takes it as it takes the teacher.
    exported = onnx.load(str(result.onnx_path))
    teacher_model = onnx.load(str(teacher))
    assert [i.name for i in exported.graph.input] == [i.name for i in teacher_model.graph.input]
    assert [o.name for o in exported.graph.output] == ["output"]
    assert np.array_equal(
        onnx.numpy_helper.to_array(exported.graph.initializer[-1]),
        onnx.numpy_helper.to_array(teacher_model.graph.initializer[-1]),
    )
    recognizer = ArcFaceRecognizer(OnnxModel(store.ensure("reference_recognizer"), threads=2))
    engine = InswapperEngine(OnnxModel(result.onnx_path, threads=2), recognizer)
    assert engine.align == spec
    source = engine.prepare_embedding(np.random.default_rng(0).standard_normal(512).astype(np.float32))
    bgr_crops = [np.ascontiguousarray(c.rgb[:, :, ::-1]) for c in train[:3]]
    swapped = engine.process([SwapItem(c, source) for c in bgr_crops])
    assert len(swapped) == 3 and all(s.shape == (128, 128, 3) and s.dtype == np.uint8 for s in swapped)
    assert float(np.abs(swapped[0].astype(np.float32) - bgr_crops[0]).mean()) > 1.0


def test_report_writes_table_json_and_grid(
    sr_data: tuple[SRSet, SRSet], model: Callable[[str], Path], tmp_path: Path
) -> None:
    _, heldout = sr_data
    teacher = model("realesr_animevideov3_x4")
    student = tmp_path / "student.onnx"
    export_verified(_student(), student)
    report = build_report(
        heldout,
        Variant("animevideov3", teacher),
        [Variant("tiny", student)],
        tmp_path / "report",
        input_size=16,
        latency_runs=2,
        grid_items=3,
        notes="notes line",
        progress=False,
    )
    names = [r.name for r in report.rows]
    assert names == ["bicubic", "animevideov3", "tiny"]
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| tiny |" in md and "notes line" in md and "16x16" in md
    data = json.loads((tmp_path / "report" / "report.json").read_text())
    tiny = data["rows"][2]
    assert tiny["params"] == model_cost(student, input_shapes={"input": [1, 3, 16, 16]}).params
    assert tiny["params"] >= sum(p.numel() for p in _student().parameters())
    assert tiny["gmac"] > 0 and tiny["latency_ms"] > 0 and tiny["size_mb"] > 0
    assert 5 < tiny["psnr_gt"] < 60 and 0 < tiny["ssim_gt"] <= 1 and tiny["psnr_teacher"] is not None
    assert data["rows"][1]["relative_to_teacher"]["psnr_gt"] == pytest.approx(1.0)
    grid = cv2.imread(str(tmp_path / "report" / "grid.png"))
    # Columns: LR, bicubic, teacher, tiny, ground truth; three rows of 48 px faces.
    assert grid.shape == (18 + 3 * 50, 5 * 50 - 2, 3)


def _cli(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="swapcast")
    sub = parser.add_subparsers(dest="command", required=True)
    engines_group.register(sub)
    args = parser.parse_args(list(argv))
    code: int = args.func(args)
    return code


@pytest.mark.slow
def test_engines_commands_end_to_end(tmp_path: Path, model: Callable[[str], Path], model_root: Path) -> None:
    teacher = str(model("realesr_animevideov3_x4"))
    data, out = tmp_path / "data", tmp_path / "out"
    common = ["--no-progress", "--threads", "2"]
    assert (
        _cli("engines", "dataset", "--out", str(data), "--teacher", teacher, "--lr-size", "12",
             "--train-count", "16", "--heldout-count", "4", "--scan-count", "2", *common)
        == 0
    )  # fmt: skip
    meta = json.loads((data / "dataset.json").read_text())
    assert meta["heldout_photos"] == ["astronaut", "tom_hanks"] and meta["train_photos"] == ["t1"]
    assert meta["faces"]["t1"] == 6 and meta["scale"] == 4
    assert (
        _cli("engines", "prune", "--data", str(data), "--out", str(out), "--model", teacher, "--target", "0.2",
             "--ratios", "0.5", "--finetune-steps", "2", "--batch", "2", *common)
        == 0
    )  # fmt: skip
    plan = json.loads((out / "realesr_animevideov3_x4_pruned.json").read_text())
    assert plan["cost_after"]["params"] < plan["cost_before"]["params"]
    assert len(plan["finetune_losses"]) == 2
    assert (
        _cli("engines", "distill", "--data", str(data), "--out", str(out), "--student", "srvgg:8x2", "--steps", "3",
             "--batch", "4", *common)
        == 0
    )  # fmt: skip
    assert (
        _cli("engines", "report", "--data", str(data), "--out", str(out / "report"), "--teacher", teacher,
             "--variant", f"pruned={out / 'realesr_animevideov3_x4_pruned_ft.onnx'}",
             "--variant", f"student={out / 'student.onnx'}", "--size", "16", "--runs", "1", *common)
        == 0
    )  # fmt: skip
    assert {p.name for p in (out / "report").iterdir()} == {"report.md", "report.json", "grid.png"}
    with pytest.raises(engine_tools.UserError, match="srvgg"):
        _cli("engines", "distill", "--data", str(data), "--out", str(out), "--student", "vgg:8")
