"""`scripts/gpu-check.sh --dry`: the GPU check's CPU-only parts, run as CI runs them, with one JSON report;
and the parts a machine without TensorRT or PyAV cannot run are skipped with the reason."""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.bench import gpu_check
from engines.store import ModelStore

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # a fresh interpreter importing torch: about 20 s here
def test_the_dry_run_checks_the_cpu_parts_and_writes_one_report(store: ModelStore, tmp_path: Path) -> None:
    store.ensure("realesr_animevideov3_x2")
    report_path = tmp_path / "report.json"
    command = ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--dry", "--output", str(report_path)]
    command += ["--model-dir", str(store.root), "--models", "realesr_animevideov3_x2", "--budget", "120"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHON": sys.executable}
    )
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(report_path.read_text())
    sections = report["sections"]
    assert report["dry"] and list(sections) == [
        "versions",
        "pytest_gpu",
        "torch",
        "capture_concurrency",
        "tensorrt",
        "bench_engines",
        "bench_batch",
    ]
    assert sections["versions"]["torch"] and sections["versions"]["onnxruntime"]
    torch_part = sections["torch"]["models"]["realesr_animevideov3_x2"]
    assert torch_part["capture_ready"] and torch_part["fp32_max_abs_vs_onnxruntime"] < 1e-4
    skipped = {name: s["reason"] for name, s in sections.items() if s["status"] == "skipped"}
    assert set(skipped) == {"pytest_gpu", "capture_concurrency", "tensorrt", "bench_engines", "bench_batch"}
    assert all(skipped.values())  # each says why
    assert "gpu-check: report written to" in done.stdout


def test_parts_without_tensorrt_or_pyav_are_skipped_with_the_reason(
    store: ModelStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    present = gpu_check.has
    monkeypatch.setattr(gpu_check, "has", lambda module: module not in ("tensorrt", "av") and present(module))
    args = argparse.Namespace(
        dry=False, output=tmp_path / "r.json", budget=60.0, model_dir=store.root, models=("realesr_animevideov3_x2",)
    )
    check = gpu_check.Check(args)
    assert check.tensorrt() == {"status": "skipped", "reason": "TensorRT is not installed"}
    assert check.bench_engines()["reason"] == "PyAV is not installed (the benchmark clips need it)"
    assert check.bench_batch()["status"] == "skipped"
