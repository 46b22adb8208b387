"""`swapcast bench-stability` over two engines: one report with each engine's occlusion figures and its own
flicker rows (app.bench.stability.measure runs the engines in turn)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.usefixtures("hand_model")
def test_each_engine_gets_its_occlusion_figures_and_flicker_rows(tmp_path: Path, model_root: Path) -> None:
    out = tmp_path / "stability.json"
    done = subprocess.run(
        [sys.executable, "-m", "app.cli", "bench-stability", "--engines", "classic,mesh", "--frames", "8"]
        + ["--threads", "2", "--out", str(out)],
        cwd=REPO,
        env={**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert list(report["occlusion"]) == ["classic", "mesh"]
    assert all(figures["frames"] == 8 for figures in report["occlusion"].values())
    by_engine = {engine: [r for r in report["flicker"] if r["engine"] == engine] for engine in ("classic", "mesh")}
    # classic's five points are Kalman-filtered only; mesh is measured smoothed and raw.
    assert {r["landmarks"] for r in by_engine["classic"]} == {"kalman"}
    assert {r["landmarks"] for r in by_engine["mesh"]} == {"one-euro", "raw"}
    assert len(report["flicker"]) == len(by_engine["classic"]) + len(by_engine["mesh"])
