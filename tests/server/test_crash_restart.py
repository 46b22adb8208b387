"""The server process crashes (SIGSEGV, as a fault in a codec ends it) and a supervisor starts it again a second
later, as the shipped systemd unit does: the log holds every thread's stack, the channel's RTSP URL plays again
with the slate, and a publisher that reconnects as the page does is on the channel again. Prints the figures
docs/operations/faults.md quotes:

    .venv/bin/python -m pytest -s -m slow tests/server/test_crash_restart.py

Everything is on loopback: `swapcast serve` (ICE on 127.0.0.1 only), FFmpeg's WHIP muxer as the publisher, PyAV
reading the channel's RTSP URL as OBS's media source does."""

from __future__ import annotations

import os
import re
import signal
import socket
import threading
import time
from pathlib import Path

import av
import httpx
import numpy as np
import pytest

from app.auth.keys import KeyStore
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.clips import MotionClip
from app.media.rtsp_in import LIVE_OPTIONS
from app.model_store import ModelStore
from tests.helpers import ServeProcess, wait_for
from tests.server.channel_clients import Seen, banded, what_it_shows
from tests.server.credentials import USER_SCOPES, bearer
from tests.server.harness import upload
from tests.server.whip_publisher import WhipPublisher, whip_unavailable_reason

UNAVAILABLE = rtsp_unavailable_reason() or whip_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"cannot run: {UNAVAILABLE}")

RESTART_SEC = 1.0  # deploy/systemd/swapcast.service: RestartSec=1s
CONSUMER_RETRY_S = 1.0  # the RTSP consumer opens the URL again this long after it failed
PAGE_BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 10.0)  # the page's reconnection delays (app/static/app.js, BACKOFF_MS)
FPS = 15
THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$", re.MULTILINE)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ReconnectingConsumer:
    """Reads an RTSP URL on a thread and opens it again `CONSUMER_RETRY_S` after it fails or ends, recording every
    decoded frame (when, and what it showed)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen = Seen()
        self.opened: list[float] = []  # when each connection opened
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                with av.open(self.url, options=LIVE_OPTIONS, timeout=(5, 5)) as container:
                    self.opened.append(time.monotonic())
                    for frame in container.decode(video=0):
                        shows = what_it_shows(np.asarray(frame.to_ndarray(format="bgr24"), np.uint8))
                        self.seen.frames.append((time.monotonic(), shows))
                        if self._stop.is_set():
                            return
            except Exception as exc:  # the server went away (or is not back yet): try again
                self.seen.errors.append(f"{time.monotonic():.2f} {exc!r}")
            self._stop.wait(CONSUMER_RETRY_S)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


def ready(base: str, probe: str = "/readyz") -> bool:
    try:
        return httpx.get(f"{base}{probe}", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def when_up(base: str, within_s: float = 180.0) -> tuple[float, float]:
    """When the server at `base` first answers /healthz (serving) and /readyz (models warm) with 200."""
    deadline = time.monotonic() + within_s
    times: list[float] = []
    for probe in ("/healthz", "/readyz"):
        while not ready(base, probe):
            assert time.monotonic() < deadline, f"the restarted server did not answer {probe}"
            time.sleep(0.1)
        times.append(time.monotonic())
    return times[0], times[1]


@pytest.mark.slow
def test_after_a_crash_and_a_restart_the_channel_plays_the_slate_then_the_reconnected_publisher(
    tmp_path: Path, model_root: Path, store: ModelStore, tom_png: bytes, clip: MotionClip
) -> None:
    store.ensure("retinaface_mnet025")
    keys_file = tmp_path / "keys.json"
    key = KeyStore(keys_file).create("streamer", list(USER_SCOPES))[1]
    port, rtsp_port = free_port(), free_port()
    args = ["--port", str(port), "--rtsp-port", str(rtsp_port), "--identity-dir", str(tmp_path / "identities")]
    env = {"SWAPCAST_KEYS_FILE": str(keys_file), "SWAPCAST_CHANNEL_DIR": str(tmp_path / "channels")}
    env |= {"SWAPCAST_ENGINE": "classic", "SWAPCAST_AUTH_FAILURE_DELAY_S": "0"}
    base = f"http://127.0.0.1:{port}"

    def serve(log: str) -> ServeProcess:
        with (tmp_path / log).open("w") as stderr:  # the server's log: faulthandler writes there
            return ServeProcess("tests.deploy.loopback_serve", args, model_root, stderr=stderr, **env)

    first = serve("first.log").wait_ready(120)
    servers = [first]
    consumer: ReconnectingConsumer | None = None
    publishers: list[WhipPublisher] = []
    try:
        identity = upload(base, tom_png, "tom.png", headers=bearer(key)).json()["id"]
        body = {"name": "evening", "width": 640, "height": 480, "fps": FPS}
        made = httpx.post(f"{base}/v1/channels", headers=bearer(key), json=body, timeout=30)
        assert made.status_code == 201, made.text
        whip = f"{base}/v1/sessions?identity={identity}&channel=evening"
        frames = banded(clip.frames, "red")
        for directory in ("p0", "p1"):
            (tmp_path / directory).mkdir()
        publishers.append(WhipPublisher(whip, key, frames, tmp_path / "p0", fps=FPS))
        consumer = ReconnectingConsumer(made.json()["rtsp_url"])
        seen = consumer.seen
        assert wait_for(lambda: sum(s == "red" for _, s in seen.frames) > 2 * FPS, 90), publishers[0].output()

        # The crash, and the supervisor: the same command again RESTART_SEC after the process ended.
        killed = time.monotonic()
        first.proc.send_signal(signal.SIGSEGV)
        assert first.proc.wait(30) == -signal.SIGSEGV
        ended = time.monotonic()
        time.sleep(RESTART_SEC)
        servers.append(serve("second.log"))
        back_up: list[tuple[float, float, float]] = []
        restarted = servers[1].proc.pid
        threading.Thread(target=lambda: back_up.append((*when_up(base), cpu_seconds(restarted))), daemon=True).start()

        # The publisher, as the page does: it notices the loss (FFmpeg's muxer fails on its next write), then
        # tries again after each of the page's delays until the server is ready.
        assert wait_for(lambda: publishers[0].failed, 10), "the publisher did not notice the server was gone"
        lost = time.monotonic()
        for attempt in range(30):  # the page keeps trying at its last delay
            time.sleep(PAGE_BACKOFF_S[min(attempt, len(PAGE_BACKOFF_S) - 1)])
            if ready(base):
                break
        assert ready(base), "the restarted server did not become ready"
        reconnected = time.monotonic()
        publishers.append(WhipPublisher(whip, key, frames, tmp_path / "p1", fps=FPS))
        assert wait_for(lambda: seen.first("red", after=reconnected) is not None, 90), publishers[1].output()
    finally:
        if consumer is not None:
            consumer.stop()
        for publisher in publishers:
            publisher.stop()
        for server in servers:
            if server.proc.poll() is None:
                server.proc.kill()
            server.proc.wait(30)

    log = (tmp_path / "first.log").read_text()
    assert "Fatal Python error: Segmentation fault" in log, log[-3000:]
    assert len(THREAD.findall(log)) >= 2, log[-3000:]  # every thread's stack, not only the current one's
    reopened = min(t for t in consumer.opened if t > killed)  # frames sent before the crash may come after it
    before = max(t for t, _ in seen.frames if t < reopened)
    back = min(t for t, _ in seen.frames if t > reopened)
    swapped = seen.first("red", after=reopened)
    assert swapped is not None
    on_slate = [s for t, s in seen.frames if back <= t < swapped]
    assert on_slate and set(on_slate) == {"other"}, "after the restart the consumer saw something but the slate"
    figures = {
        "process ended after the signal": ended - killed,
        "server answering again after the crash (/healthz)": back_up[0][0] - killed,
        "server ready again after the crash (/readyz)": back_up[0][1] - killed,
        "CPU time the restarted server used until ready": back_up[0][2],
        "publisher noticed the loss after the crash": lost - killed,
        "publisher reconnected after the crash": reconnected - killed,
        "consumer's URL played again after the crash": reopened - killed,
        "consumer without frames (last before, first after)": back - before,
        "consumer on the slate": swapped - back,
        "crash to the publisher's frames on the channel again": swapped - killed,
    }
    print(f"\n  (load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    for what, seconds in figures.items():
        print(f"  {what}: {seconds:.2f} s")
    assert swapped - killed < 180, figures  # the restart's own time, which load on the machine stretches


@pytest.mark.slow
def test_serve_writes_every_threads_stack_to_its_log_when_it_faults(tmp_path: Path, model_root: Path) -> None:
    args = ["--port", "0", "--no-rtsp", "--identity-dir", str(tmp_path / "identities")]
    with (tmp_path / "serve.log").open("w") as stderr:
        serve = ServeProcess("app.commands.serve", args, model_root, stderr=stderr)
    try:
        assert wait_for(lambda: any(line.startswith("  loading models") for line in serve.lines), 120), serve.lines
        serve.proc.send_signal(signal.SIGSEGV)
        assert serve.proc.wait(30) == -signal.SIGSEGV
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
        serve.proc.wait(30)
    log = (tmp_path / "serve.log").read_text()
    assert "Fatal Python error: Segmentation fault" in log, log[-3000:]
    assert "Current thread 0x" in log and len(THREAD.findall(log)) >= 2, log[-3000:]
