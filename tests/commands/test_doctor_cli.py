"""`swapcast doctor`: one line per capability, the fix where one is missing, and exit status 0 exactly when
`swapcast serve` can start."""

import json
import socket
from pathlib import Path

import pytest

from app.cli import main
from app.doctor import check_gpu, check_maps, check_models, check_nvenc, check_rtsp, check_srt
from app.server.settings import ServerSettings
from engines.store import ModelStore
from engines.tensorrt.versions import installed_stack

CAPABILITIES = (
    "RTSP output",
    "ffmpeg",
    "ffprobe",
    "face detector",
    "mesh landmarks",
    "iris model",
    "hand model (occlusion)",
    "swap weights",
    "identity maps",
    "NVIDIA GPU",
    "TensorRT",
    "NVENC",
    "HTTP port",
    "identity dir",
    "access",
)


@pytest.fixture(autouse=True)
def _isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPCAST_KEYS_FILE", str(tmp_path / "keys.json"))
    monkeypatch.setenv("SWAPCAST_MODEL_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("SWAPCAST_IDENTITY_DIR", str(tmp_path / "identities"))
    monkeypatch.setenv("SWAPCAST_PORT", "0")
    monkeypatch.setenv("SWAPCAST_RTSP_ENABLED", "false")


def test_every_capability_has_a_line_and_serve_can_start(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor"]) == 0
    out = capsys.readouterr().out
    for name in CAPABILITIES:
        assert f"  {name}" in out, name
    assert "swap weights" in out and "-> swapcast models fetch inswapper_128 arcface_w600k_r50" in out
    assert out.rstrip().endswith("swapcast serve can start")


def test_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["can_serve"] is True
    assert {c["state"] for c in report["checks"]} <= {"ok", "missing", "warn"}
    assert all(set(c) == {"name", "state", "detail", "fix"} for c in report["checks"])


def test_a_public_address_without_credentials_cannot_serve(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--host", "0.0.0.0"]) == 1
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if "  access" in line)
    assert line.startswith("FAIL") and "swapcast keys create NAME --scope admin" in line
    assert "swapcast serve cannot start" in out


def test_a_busy_port_and_an_unwritable_identity_dir_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert main(["doctor", "--port", str(taken), "--identity-dir", str(blocker / "ids")]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert next(line for line in lines if "  HTTP port" in line).startswith("FAIL")
    assert next(line for line in lines if "  identity dir" in line).startswith("FAIL")


def test_a_refused_setting_is_one_error_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SWAPCAST_MAX_SESSIONS", "none")
    assert main(["doctor"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swapcast: error: invalid setting max_sessions") and "Traceback" not in err


def test_missing_pieces_name_their_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = ServerSettings(rtsp_enabled=True)
    rtsp = check_rtsp(settings, lambda: "PyGObject is not installed")
    assert (rtsp.state, rtsp.fix) == ("missing", "bash scripts/setup.sh (Debian's GStreamer and the rtsp extra)")
    assert check_rtsp(settings, lambda: None).state == "ok"
    srt = check_srt(ServerSettings(srt_port=8890), lambda: "the SRT output needs libsrt")
    assert (srt.state, srt.fix) == ("missing", "bash scripts/setup.sh (libsrt)")
    assert check_srt(ServerSettings(), lambda: "never asked").detail == "off (SWAPCAST_SRT_PORT is not set)"

    monkeypatch.setattr("app.doctor.importlib.util.find_spec", lambda name: None)
    models = {c.name: c for c in check_models(settings, ModelStore(tmp_path / "empty"))}
    assert models["mesh landmarks"].state == "missing"
    assert "swapcast[mesh-import]" in models["mesh landmarks"].fix
    assert "swapcast[assets]" in models["face detector"].fix
    maps = check_maps()
    assert (maps.state, maps.fix) == ("missing", "pip install 'swapcast[match]'")


def test_gpu_lines_follow_the_driver(tmp_path: Path) -> None:
    absent = tmp_path / "no-driver"
    assert check_gpu(absent)[0].state == "missing"
    assert check_nvenc(absent).state == "missing"
    driver = tmp_path / "version"
    driver.write_text("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06\nGCC version: 12\n")
    lines = {c.name: c for c in check_gpu(driver)}
    assert lines["NVIDIA GPU"].state == "ok" and "580.65.06" in lines["NVIDIA GPU"].detail
    if installed_stack().tensorrt is None:  # a GPU without TensorRT: the fix names the gpu extra
        assert lines["TensorRT"].state == "missing"
        assert "swapcast[gpu]" in lines["TensorRT"].fix


class _HandStore:
    root = Path("/models")

    def __init__(self, verified: set[str]) -> None:
        self.verified = verified

    def status(self, name: str) -> str:
        return "verified" if name in self.verified else "missing"


def test_the_hand_check_names_the_hand_model_auto_runs() -> None:
    from app.doctor import _hand_check

    settings = ServerSettings()
    lite = _hand_check(settings, _HandStore({"hand_landmark_lite"}))  # type: ignore[arg-type]
    assert lite.state == "ok" and lite.detail.startswith("hand_landmark_lite verified")
    # Only the full model imported (before lite was the default): auto runs it, and says so.
    full = _hand_check(settings, _HandStore({"hand_landmark"}))  # type: ignore[arg-type]
    assert full.state == "ok" and full.detail.startswith("hand_landmark verified")
    assert "(hand_landmark_lite is not)" in full.detail
    none = _hand_check(settings, _HandStore(set()))  # type: ignore[arg-type]
    assert none.state == "warn" and "swapcast models import hand_landmark_lite" in none.fix
