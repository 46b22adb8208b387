"""`python -m app.bench.eye_check_bench`: the closed-eye check's value per sample face and its cost."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_prints_each_face_and_the_cost_beside_the_mesh_prepare(model_root: Path) -> None:
    env = {**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "app.bench.eye_check_bench", "--repeats", "2"]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    faces = {face["face"]: face for face in report["faces"]}
    assert [faces[f"t1[{i}]"]["eyes_closed_warning"] for i in range(6)] == [False] * 5 + [True]
    assert not faces["astronaut"]["eyes_closed_warning"]
    assert max(faces["t1[5]"]["left_eye"], faces["t1[5]"]["right_eye"]) <= report["threshold"]
    for timing in (report["eye_check_ms"], report["mesh_prepare_ms"]):
        assert 0 < timing["p50"] <= timing["p99"]
