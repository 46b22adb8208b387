"""`swapcast cam` against a real server on 127.0.0.1: a video file as the camera, the sink replaced at its
boundary by a recorder that keeps what the virtual camera would have been given."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.auth.keys import KeyStore
from app.auth.settings import AccessSettings
from app.cam.run import CamOptions, run_cam
from app.cam.stats import CamStats
from app.cli import main
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.recording_sink import RecordingSink
from tests.server.harness import PAGE_HEADERS, RunningServer, camera_file, server_settings, start_server, upload
from tests.server.test_sessions import REPO, background_diff, face_diff

CAMERA_FPS = 15


@pytest.fixture(scope="module")
def slow_camera(tmp_path_factory: pytest.TempPathFactory, clip: MotionClip) -> tuple[Path, MotionClip]:
    """The clip as a 15 fps file (3 s, looped by the command): what a laptop's camera sends, within what this
    machine's server swaps in time."""
    slow = MotionClip(clip.frames, clip.matrices, CAMERA_FPS)
    return camera_file(tmp_path_factory.mktemp("camera"), slow, frames=len(clip.frames)), slow


@pytest.mark.slow
@pytest.mark.alone
def test_the_swapped_camera_reaches_the_sink_stamped_in_order_and_at_the_camera_rate(
    server: RunningServer,
    tom_png: bytes,
    slow_camera: tuple[Path, MotionClip],
    clip_faces: list[np.ndarray],
) -> None:
    identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
    path, slow = slow_camera
    sink, stats = RecordingSink(), CamStats()
    options = CamOptions(server=server.base_url, camera=str(path), identity=identity, seconds=12, measure=True)
    run_cam(options, sink, stats)

    assert sink.size == (640, 480) and sink.closed
    assert sink.threads == {"cam-sink"}, "the sink is opened and fed off the event loop, on one thread"
    ids = [s for s in sink.stamps if s is not None]
    assert len(ids) >= 0.95 * len(sink.stamps), "stamps damaged on the way"
    assert ids == sorted(set(ids)), f"frames out of order or repeated: {ids}"
    assert stats.sessions == 1 and stats.shown == len(sink.stamps)
    # The rate: nearly every frame sent comes back and is shown (the first ones wait for the connection).
    assert stats.shown >= 0.9 * (stats.sent - 2 * CAMERA_FPS), stats.line()
    assert stats.sent >= 8 * CAMERA_FPS, stats.line()
    assert stats.percentile_ms(95) is not None

    # Swapped: each kept frame differs from the camera's frame in the face, not in the background (the camera
    # frame it came from is the one whose background matches best).
    for image in sink.images:
        k = min(range(len(slow.frames)), key=lambda i: background_diff(image, slow.frames[i]))
        face, noise = face_diff(image, slow.frames[k], clip_faces[k]), background_diff(image, slow.frames[k])
        assert face > 12 and face > 3 * noise, (k, face, noise)


@pytest.fixture(scope="module")
def keyed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """A server that wants an API key (one exists), without models: refusals only."""
    root = tmp_path_factory.mktemp("keyed")
    keys = root / "keys.json"
    _, running_key = KeyStore(keys).create("laptop", ["sessions"])

    def no_models(_: PipelineSettings) -> FramePipeline:
        raise RuntimeError("this server only refuses")

    settings = server_settings(root / "identities", access=AccessSettings(keys_file=keys), warmup=False)
    running = start_server(settings, no_models, wait_ready=False)
    running.key = running_key  # type: ignore[attr-defined]
    yield running
    running.stop()


@pytest.fixture
def recorded_camera(slow_camera: tuple[Path, MotionClip], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """`--camera FILE` for `main`, whose sink is then a recorder."""
    monkeypatch.setattr("app.cam.sinks.make_sink", lambda output: RecordingSink())
    return ["--camera", str(slow_camera[0])]


def refusal(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The one line `swapcast cam ARGV` ends with when the server refuses the session (exit status 2)."""
    code = main(["cam", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("swapcast: error: the server refused the session:"), err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    return err.strip()


def test_a_wrong_key_ends_the_command_with_the_servers_reason(
    keyed_server: RunningServer, recorded_camera: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--server", keyed_server.base_url, *recorded_camera, "--identity", "x", "--key", "wrong"]
    assert "(401)" in refusal(argv, capsys)


def test_the_key_comes_from_the_environment(
    keyed_server: RunningServer,
    recorded_camera: list[str],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With SWAPCAST_API_KEY the server gets past the credential; this one, without models, is never ready: it
    answers 503, which the command takes as passing and asks again, until its time is up."""
    monkeypatch.setenv("SWAPCAST_API_KEY", keyed_server.key)  # type: ignore[attr-defined]
    assert main(["cam", "--server", keyed_server.base_url, *recorded_camera, "--seconds", "4"]) == 0
    err = capfd.readouterr().err
    assert "(503); reconnecting in" in err and "(401)" not in err, err


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ([], "query parameter `identity` (or `map`) is required (422)"),
        (["--identity", "no-such-identity"], "(404)"),
    ],
)
def test_a_refused_session_ends_the_command_with_the_servers_reason(
    server: RunningServer, recorded_camera: list[str], capsys: pytest.CaptureFixture[str], query: list[str], reason: str
) -> None:
    assert reason in refusal(["--server", server.base_url, *recorded_camera, *query], capsys)


# Runs the command with the recorder as its sink and media on loopback only, as the tests' server offers.
CAM_WITH_RECORDER = """
import sys
import app.cam.sinks
from app.cli import main
from app.media.peer import use_host_addresses
from tests.helpers import wait_for
from tests.recording_sink import RecordingSink
use_host_addresses(["127.0.0.1"])
app.cam.sinks.make_sink = lambda output: RecordingSink()
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_ctrl_c_ends_the_session_on_the_server_and_prints_the_counts(
    server: RunningServer, tom_png: bytes, slow_camera: tuple[Path, MotionClip]
) -> None:
    identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
    path, _ = slow_camera

    def sessions() -> int:
        return int(httpx.get(f"{server.base_url}/v1/server").json()["sessions"])

    before = sessions()
    argv = ["cam", "--server", server.base_url, "--camera", str(path), "--identity", identity]
    process = subprocess.Popen(
        [sys.executable, "-c", CAM_WITH_RECORDER, *argv],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert wait_for(lambda: sessions() > before, 60), "the command never opened a session"
        time.sleep(2)
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 0, err
    assert "swapcast cam: stopped" in err and "Traceback" not in err, err
    assert out.startswith("sent "), out
    # Ended by the command's DELETE, well before the server's own media timeout would have ended it.
    assert wait_for(lambda: sessions() == before, 1.5), "the session outlived the command"


@pytest.mark.slow
def test_a_session_the_server_ends_is_replaced_by_a_new_one_by_itself_back_into_the_channel(
    server: RunningServer, tom_png: bytes, slow_camera: tuple[Path, MotionClip], capfd: pytest.CaptureFixture[str]
) -> None:
    identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
    path, _ = slow_camera
    sink, stats = RecordingSink(), CamStats()
    made = httpx.post(f"{server.base_url}/v1/channels", json={"name": "laptop"}, headers=PAGE_HEADERS)
    assert made.status_code == 201, made.text

    def publisher() -> str | None:
        return httpx.get(f"{server.base_url}/v1/channels/laptop").json()["publisher"]  # type: ignore[no-any-return]

    options = CamOptions(
        server=server.base_url, camera=str(path), identity=identity, channel="laptop", seconds=14, measure=True
    )
    runner = threading.Thread(target=run_cam, args=(options, sink, stats))
    runner.start()
    try:
        assert wait_for(lambda: len(sink.stamps) >= 15, 60), "no picture came back"
        assert server.state.sessions is not None
        (first,) = server.state.sessions.sessions()
        assert publisher() == f"session/{first.id}"
        assert httpx.delete(f"{server.base_url}/v1/sessions/{first.id}").status_code == 204
        shown_before = len(sink.stamps)
        assert wait_for(lambda: len(sink.stamps) >= shown_before + 15, 30), "the picture did not come back"
        (second,) = server.state.sessions.sessions()
        assert second.id != first.id and publisher() == f"session/{second.id}"
    finally:
        runner.join(60)
    assert stats.sessions == 2, stats.line()
    assert "the server ended the session; reconnecting in" in capfd.readouterr().err
    ids = [s for s in sink.stamps if s is not None]
    assert ids == sorted(set(ids)), "frames out of order across the sessions"


def test_without_a_key_a_terminal_is_asked_for_one(
    keyed_server: RunningServer,
    recorded_camera: list[str],
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Refused for want of a key, the command asks (getpass) and tries again with the answer, which this server
    takes (it then answers 503: not ready)."""
    monkeypatch.delenv("SWAPCAST_API_KEY", raising=False)
    monkeypatch.setattr("sys.stdin.isatty", lambda: True)
    asked: list[str] = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: asked.append(prompt) or keyed_server.key)  # type: ignore[attr-defined]
    assert main(["cam", "--server", keyed_server.base_url, *recorded_camera, "--seconds", "3"]) == 0
    err = capfd.readouterr().err
    assert len(asked) == 1 and "API key" in asked[0]
    assert "(503); reconnecting in" in err and "(401)" not in err, err
