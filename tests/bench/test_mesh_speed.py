"""`swapcast bench-mesh`: per-step cost of the mesh engine beside classic's, with the real models."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_mesh_command_writes_steps_ratios_and_the_load(tmp_path: Path, model_root: Path) -> None:
    env = {**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO)}
    out = tmp_path / "mesh.json"
    command = [sys.executable, "-m", "app.cli", "bench-mesh", "--runs"]
    done = subprocess.run([*command, "3", "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    for label in ("480p", "720p"):
        mesh = report[label]["per_face"]["mesh"]
        steps = ("landmarks", "align", "mesh_maps", "mesh_mask", "mesh_remap", "mesh_colour_blend", "paste")
        assert all(mesh[step]["n"] == 3 and mesh[step]["p50"] > 0 for step in steps)
        assert sum(mesh[step]["p50"] for step in steps) <= mesh["total"]["p99"] * 1.01
        assert report[label]["mesh_over_classic"] > 0
    whole = report["whole_frame_480p"]
    assert "detect" not in whole["mesh"] and whole["mesh"]["landmarks"]["n"] == 3  # tracked, not detected
    assert len(report["machine"]["load_average_before"]) == 3
    bad = subprocess.run([*command, "0"], cwd=REPO, env=env, capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stderr.strip() == "swapcast: error: --runs must be at least 1"
