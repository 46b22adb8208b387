"""`swapcast cam` refuses every missing piece with one line and a non-zero exit, before it connects: the camera
input picked per platform, a missing camera or file, pyvirtualcam missing or without a virtual camera, an OpenCV
without windows, a server that cannot be reached."""

from __future__ import annotations

import socket
import sys
import types
from pathlib import Path

import cv2
import numpy as np
import pytest

from app.cam.camera import CaptureInput, capture_input, is_device
from app.cam.sinks import no_backend_advice
from app.cli import main
from app.media.clips import MotionClip, write_clip
from tests.recording_sink import RecordingSink


@pytest.fixture(scope="module")
def video(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A short silent clip: the camera of these tests."""
    frames = [np.full((120, 160, 3), 40 + 10 * i, np.uint8) for i in range(10)]
    path = tmp_path_factory.mktemp("camera") / "camera.mp4"
    write_clip(MotionClip(frames, [np.eye(2, 3)] * len(frames), 10), path, audio_tone_hz=None)
    return path


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one error line `swapcast cam ARGV` ends with (non-zero exit asserted)."""
    code = main(["cam", *argv])
    err = capsys.readouterr().err
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swapcast: error: "), err
    return lines[0]


@pytest.mark.parametrize(
    ("platform", "camera", "expected"),
    [
        ("linux", "0", CaptureInput("v4l2", "/dev/video0")),
        ("linux", "/dev/video2", CaptureInput("v4l2", "/dev/video2")),
        ("darwin", "0", CaptureInput("avfoundation", "0:none")),
        ("darwin", "FaceTime HD Camera", CaptureInput("avfoundation", "FaceTime HD Camera:none")),
        ("win32", "Integrated Camera", CaptureInput("dshow", "video=Integrated Camera")),
        ("win32", "video=Integrated Camera", CaptureInput("dshow", "video=Integrated Camera")),
    ],
)
def test_the_capture_input_is_the_platforms_own(platform: str, camera: str, expected: CaptureInput) -> None:
    assert capture_input(camera, platform) == expected


def test_a_path_to_a_file_is_a_file_and_a_device_name_is_a_camera(video: Path) -> None:
    assert not is_device(str(video), "linux") and not is_device(str(video), "win32")
    assert is_device("0", "linux") and is_device("/dev/video1", "linux")
    assert is_device("Integrated Camera", "win32") and not is_device("Integrated Camera", "linux")


def test_a_missing_file_or_camera_is_named(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    server = ["--server", "http://127.0.0.1:9"]
    assert "no such camera or video file: /nope.mp4" in refused([*server, "--camera", "/nope.mp4"], capsys)
    assert "cannot open camera /dev/video63" in refused([*server, "--camera", "/dev/video63"], capsys)
    text = tmp_path / "notes.txt"
    text.write_text("not a video")
    assert f"cannot open camera {text}" in refused([*server, "--camera", str(text)], capsys)


def test_without_pyvirtualcam_the_extra_to_install_is_named(
    video: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pyvirtualcam", None)  # what an environment without the extra imports
    line = refused(["--server", "http://127.0.0.1:9", "--camera", str(video)], capsys)
    assert line == "swapcast: error: --output virtual needs pyvirtualcam: pip install 'swapcast[cam]'"


def test_pyvirtualcam_without_a_virtual_camera_says_what_to_load(
    video: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """pyvirtualcam raises RuntimeError when no backend has a device (v4l2loopback not loaded, OBS absent)."""

    class Camera:
        def __init__(self, *args: object, **kwargs: object) -> None:
            raise RuntimeError("'v4l2loopback' backend: no v4l2 loopback device found at /dev/video[0-99]")

    fake = types.SimpleNamespace(Camera=Camera, PixelFormat=types.SimpleNamespace(RGB="RGB"))
    monkeypatch.setitem(sys.modules, "pyvirtualcam", fake)
    monkeypatch.setattr(sys, "platform", "linux")
    line = refused(["--server", "http://127.0.0.1:9", "--camera", str(video), "--output", "virtual"], capsys)
    assert "no virtual camera ('v4l2loopback' backend: no v4l2 loopback device found" in line
    assert "sudo modprobe v4l2loopback" in line


@pytest.mark.parametrize("platform", ["win32", "darwin"])
def test_without_a_virtual_camera_on_windows_and_macos_obs_is_named(platform: str) -> None:
    assert "install OBS Studio" in no_backend_advice(platform)
    assert "modprobe" not in no_backend_advice(platform)


@pytest.mark.skipif(
    "GUI:                           NONE" not in cv2.getBuildInformation(),
    reason="this OpenCV has GUI support (the project ships opencv-python-headless)",
)
def test_a_window_with_headless_opencv_says_which_opencv_to_install(
    video: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = refused(["--server", "http://127.0.0.1:9", "--camera", str(video), "--output", "window"], capsys)
    assert "opencv-python-headless" in line and "pip install opencv-python" in line


def test_a_server_that_cannot_be_reached_is_named(
    video: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    with socket.socket() as closed:  # a loopback port nobody listens on
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setattr("app.cam.sinks.make_sink", lambda output: RecordingSink())
    line = refused(["--server", url, "--camera", str(video), "--identity", "x"], capsys)
    assert line.startswith(f"swapcast: error: cannot reach the server at {url}: "), line
