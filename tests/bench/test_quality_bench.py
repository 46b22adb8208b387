"""`swapcast bench-quality` on the sample photos: the mesh engine meets its quality targets, measured by dlib."""

import json
import os
import subprocess
import sys
from pathlib import Path

import cv2
import pytest

from app.bench.quality_bench import QualityBench, make_pairs, portraits
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
    done = subprocess.run([*command, "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads((out / "quality.json").read_text())
    assert report["pairs"] == 2 and [e["engine"] for e in report["engines"]] == ["passthrough", "mesh"]
    assert "landmark error" in done.stdout and "mesh" in done.stdout
    grid = cv2.imread(str(out / "grid.png"))
    assert grid is not None and grid.shape[1] == 4 * 128 and grid.shape[0] == 24 + 2 * 128
    bad = subprocess.run(
        [*command[:5], "0", "--out", str(tmp_path / "none")], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert bad.returncode != 0 and bad.stderr.strip() == "swapcast: error: --pairs must be at least 1"
    assert not (tmp_path / "none").exists()
