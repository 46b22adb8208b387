"""`swapcast bench-quality` on the sample photos: the mesh engine meets its quality targets, measured by dlib;
the command's occlusion and flicker rows carry the measured figures, judged against their targets."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import cv2
import pytest

from app.bench import targets
from app.bench.quality_bench import QualityBench, make_pairs, portraits
from app.bench.stability import flicker_figures, occlusion_figures
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.factory import build_pipeline
from app.settings import PipelineSettings
from engines.store import ModelStore

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_mesh_follows_the_target_and_carries_the_source_identity(
    store: ModelStore, detector: RetinaFaceDetector
) -> None:
    engines = {
        name: build_pipeline(PipelineSettings(engine=name, faces="largest", threads=2), store)
        for name in ("passthrough", "classic", "mesh")
    }
    people = portraits(detector)
    assert len(people) >= 8  # astronaut, the six faces of t1, Tom Hanks
    report = QualityBench(engines).run(make_pairs(people))
    scores = {score.engine: score for score in report.engines}
    assert all(score.failed == 0 and score.pairs == report.pairs for score in scores.values())
    floor, classic, mesh = scores["passthrough"], scores["classic"], scores["mesh"]
    assert floor.closer_to_source == 0 and floor.landmark_error < 0.02
    # The targets of the mesh engine: expression and pose of the target, identity of the source.
    assert mesh.landmark_error <= 0.07, mesh
    assert mesh.closer_to_source >= 0.9, mesh
    assert mesh.landmark_error < 0.7 * classic.landmark_error, (mesh, classic)


@pytest.mark.slow
def test_bench_quality_command_writes_json_and_grid(tmp_path: Path, model_root: Path) -> None:
    env = {**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO)}
    out = tmp_path / "report"
    command = [sys.executable, "-m", "app.cli", "bench-quality", "--pairs", "2", "--engines", "passthrough,mesh"]
    run = [*command, "--sections", "likeness", "--out", str(out)]
    done = subprocess.run(run, cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "quality.json").read_text())
    assert report["pairs"] == 2 and [e["engine"] for e in report["engines"]] == ["passthrough", "mesh"]
    assert "landmark error" in done.stdout and "mesh" in done.stdout
    # Likeness rows: the mesh engine's judged against its targets, passthrough's (the floor) shown without one.
    scores = {e["engine"]: e for e in report["engines"]}
    rows = {(r["engine"], r["key"]): r for r in report["rows"]}
    assert set(rows) == {(e, k) for e in scores for k in ("closer_to_source", "landmark_error")}
    for (engine, key), row in rows.items():
        assert row["value"] == scores[engine][key]
    assert (
        rows["passthrough", "landmark_error"]["target"] is None and rows["passthrough", "landmark_error"]["met"] is None
    )
    mesh_error = rows["mesh", "landmark_error"]
    assert mesh_error["target"] == "<= 0.06" and mesh_error["met"] == (mesh_error["value"] <= 0.06)
    assert "closer to source (share)" in done.stdout
    grid = cv2.imread(str(out / "grid.png"))
    assert grid is not None and grid.shape[1] == 4 * 128 and grid.shape[0] == 24 + 2 * 128
    bad = subprocess.run(
        [*command[:5], "0", "--out", str(tmp_path / "none")], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert bad.returncode != 0 and bad.stderr.strip() == "swapcast: error: --pairs must be at least 1"
    assert not (tmp_path / "none").exists()


def test_a_row_is_met_up_to_its_target_and_not_past_it() -> None:
    (ratio,) = [spec for spec in targets.FLICKER if spec.key == "still_flicker_ratio"]
    assert targets.judge(ratio, "classic", 1.2)["met"] is True
    assert targets.judge(ratio, "classic", 1.21)["met"] is False
    (kept,) = [spec for spec in targets.OCCLUSION if spec.key == "hand_kept"]
    assert targets.judge(kept, "mesh", 0.9)["met"] is True
    assert targets.judge(kept, "mesh", 0.89)["met"] is False
    (error,) = [spec for spec in targets.LIKENESS if spec.key == "landmark_error"]
    assert targets.judge(error, "mesh", 0.061) == {
        "section": "likeness",
        "engine": "mesh",
        "row": "landmark error",
        "key": "landmark_error",
        "value": 0.061,
        "target": "<= 0.06",
        "met": False,
    }
    # The likeness targets are the mesh engine's: another engine's figure is shown without a verdict.
    assert targets.judge(error, "classic", 0.2)["met"] is None


@pytest.mark.slow
@pytest.mark.usefixtures("hand_model")
def test_bench_quality_reports_occlusion_and_flicker_rows_judged_from_the_run(tmp_path: Path, model_root: Path) -> None:
    env = {**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO)}
    out = tmp_path / "report"
    command = [sys.executable, "-m", "app.cli", "bench-quality", "--engines", "mesh", "--sections", "occlusion,flicker"]
    done = subprocess.run(
        [*command, "--frames", "12", "--threads", "2", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "quality.json").read_text())
    assert report["sections"] == ["occlusion", "flicker"] and "engines" not in report
    occlusion = report["occlusion"]["mesh"]
    assert occlusion["frames"] == 12 and occlusion["frames_with_hand_over_face"] > 0
    figures = {**occlusion_figures(occlusion), **flicker_figures(report["flicker"])}
    rows = report["rows"]
    assert [(r["section"], r["key"]) for r in rows] == [
        (spec.section, spec.key) for spec in (*targets.OCCLUSION, *targets.FLICKER)
    ]
    for row in rows:
        # Every value is a real figure of this run, and its verdict is the target's on that figure.
        assert row["engine"] == "mesh" and row["value"] == figures[row["key"]] and math.isfinite(row["value"])
        spec = next(s for s in (*targets.OCCLUSION, *targets.FLICKER) if s.key == row["key"])
        assert row["met"] == (spec.target.met(row["value"]) if spec.target else None)
    values = {row["key"]: row["value"] for row in rows}
    assert 0.5 < values["hand_kept"] <= 1.0 and 0.0 < values["iou"] <= 1.0 and values["face_swapped"] > 0.5
    assert values["ms_per_face"] > 0 and values["still_flicker_ratio"] > 0 and values["still_jitter_px"] > 0
    assert "flicker ratio, still clip" in done.stdout and "IoU with the true hand" in done.stdout

    bad = subprocess.run(
        [*command[:6], "--sections", "nope", "--out", str(tmp_path / "none")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode != 0
    assert bad.stderr.strip() == "swapcast: error: unknown section 'nope'; choose from likeness, occlusion, flicker"
