"""The host policy and redirect refusal hold on every reconnect of a stream, not only when it is created: a source
that starts redirecting later, or a name that resolves to a forbidden address later, fails the stream instead of
sending FFmpeg there."""

import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.egress.rtsp import rtsp_unavailable_reason
from app.media.rtsp_in import IngestWorker, SourceForbidden
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.server.ingest_policy import HostUnresolved, IngestPolicy, SourceRefused
from app.settings import PipelineSettings
from tests.server.harness import server_settings, start_server, start_stream
from tests.server.loopback import LoopbackServer, reply_head

UNAVAILABLE = rtsp_unavailable_reason()
needs_rtsp = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")
PipelineFactory = Callable[[PipelineSettings], FramePipeline]
# 127.0.0.2 is loopback too, but outside the networks these tests let ingest reach.
FORBIDDEN_HOST = "127.0.0.2"
PUBLIC = b"Public: OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN"


class Listener(LoopbackServer):
    """A TCP port that counts the connections it gets (the internal service a redirect would aim at)."""

    def __init__(self, host: str) -> None:
        self.connections = 0
        super().__init__(host)

    def handle(self, conn: socket.socket) -> None:
        self.connections += 1
        conn.close()


class TurningSource(LoopbackServer):
    """An RTSP source on 127.0.0.1 that answers DESCRIBE with 404 (ingest retries) until `turn()`, and from then
    on with a redirect to `location` (which FFmpeg follows). Other requests get 200."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.describes = 0
        self.redirecting = False
        super().__init__()

    def turn(self) -> None:
        self.redirecting = True

    def handle(self, conn: socket.socket) -> None:
        threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(3)
            pending = b""
            while not self._stop.is_set():
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                pending += data
                while b"\r\n\r\n" in pending:
                    request, pending = pending.split(b"\r\n\r\n", 1)
                    if request.startswith(b"DESCRIBE"):
                        self.describes += 1
                        if self.redirecting:
                            reply = reply_head(b"RTSP/1.0 302 Moved Temporarily", request) + b"Location: "
                            reply += self.location.encode()
                        else:
                            reply = reply_head(b"RTSP/1.0 404 Not Found", request).rstrip(b"\r\n")
                    else:
                        reply = (
                            reply_head(b"RTSP/1.0 200 OK", request)
                            + b"Public: OPTIONS, DESCRIBE, SETUP, PLAY, TEARDOWN"
                        )
                    conn.sendall(reply + b"\r\nContent-Length: 0\r\n\r\n")


@needs_rtsp
def test_a_source_that_starts_redirecting_fails_the_stream_on_reconnect(
    identity_dir: Path, pipeline_factory: PipelineFactory, tom_png: bytes
) -> None:
    internal = Listener(FORBIDDEN_HOST)
    source = TurningSource(f"rtsp://{FORBIDDEN_HOST}:{internal.port}/internal/admin")
    settings = server_settings(identity_dir, rtsp_enabled=True, rtsp_port=0, ingest_allowed_networks=["127.0.0.1/32"])
    try:
        with start_server(settings, pipeline_factory) as server:
            if not server.state.rtsp.available:
                pytest.skip("RTSP output unavailable")
            base = server.base_url
            stream = start_stream(base, tom_png, f"rtsp://127.0.0.1:{source.port}/cam")
            deadline = time.monotonic() + 10
            while httpx.get(f"{base}/v1/streams/{stream}").json()["stats"].get("reconnects", 0) < 1:
                assert time.monotonic() < deadline, "the stream never tried to reconnect"
                time.sleep(0.05)
            source.turn()
            while (got := httpx.get(f"{base}/v1/streams/{stream}").json())["state"] != "failed":
                assert internal.connections == 0, "a reconnect followed the redirect to the internal port"
                assert time.monotonic() < deadline + 10, got
                time.sleep(0.05)
            assert "host policy" in got["reason"], got
            time.sleep(0.5)
            assert internal.connections == 0
    finally:
        source.close()
        internal.close()


def test_a_name_that_resolves_elsewhere_later_fails_the_worker() -> None:
    """A real ingest worker whose every open is checked against a policy whose name lookup changes answer: the
    first open goes to an allowed (closed) port, the reconnect finds the name at the metadata address and fails;
    a lookup that fails meanwhile is retried, not fatal."""
    answers = iter([["127.0.0.1"], [], ["169.254.169.254"]])

    def resolver(host: str, port: int) -> list[str]:
        return next(answers)

    policy = IngestPolicy(allowed_networks=[ipaddress.ip_network("127.0.0.0/8")], resolver=resolver)
    opened: list[str] = []

    def before_open() -> str:
        try:
            url = policy.check("rtsp://camera.example:9/x").connect_url
        except HostUnresolved as exc:
            raise OSError(str(exc)) from None
        except SourceRefused as exc:
            raise SourceForbidden(str(exc)) from None
        opened.append(url)
        return url

    def nothing(frames: list[Image]) -> list[Image]:
        return frames

    worker = IngestWorker(
        "rtsp://camera.example:9/x",
        nothing,
        None,
        reconnect_initial_s=0.05,
        reconnect_max_s=0.05,
        before_open=before_open,
    )
    with worker:
        deadline = time.monotonic() + 10
        while worker.state != "failed":
            assert time.monotonic() < deadline, worker.stats()
            time.sleep(0.02)
    assert opened == ["rtsp://127.0.0.1:9/x"]
    error = worker.stats().last_error or ""
    assert "host policy" in error and "outside the networks" in error and worker.stats().reconnects == 2
