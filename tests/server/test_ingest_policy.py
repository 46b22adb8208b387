"""Ingest without server-side request forgery: the host policy, credentials never shown, coarse errors, and a
source that never answers becoming `failed`, freeing its slot and restartable by its owner."""

import contextlib
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

import cv2
import httpx
import numpy as np
import pytest

from app.egress.rtsp import RtspServer, rtsp_unavailable_reason
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.server.ingest_policy import IngestPolicy, SourceRefused, coarse_error, redact_credentials, refuse_redirects
from app.settings import PipelineSettings
from tests.server.harness import PAGE_HEADERS, server_settings, start_server, start_stream, upload
from tests.server.loopback import LoopbackServer, reply_head

UNAVAILABLE = rtsp_unavailable_reason()
needs_rtsp = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")
PipelineFactory = Callable[[PipelineSettings], FramePipeline]

DEFAULT = IngestPolicy.from_settings([], allow_private=True, own_ports=(8000, 8554))


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("rtsp://admin:s3cret@127.0.0.1:8204/internal/admin?delete=all", "loopback"),
        ("rtsp://localhost/x", "loopback"),
        ("rtsp://[::1]/x", "loopback"),
        ("rtsp://[::ffff:127.0.0.1]/x", "loopback"),
        ("rtsp://169.254.169.254/latest/meta-data", "link-local"),
        ("rtsp://[fe80::1]/x", "link-local"),
        ("rtsp://224.0.0.1/x", "multicast"),
        ("rtsp://0.0.0.0/x", "unspecified"),
        ("rtsp://240.0.0.1/x", "reserved"),
        ("rtsp://cam_1.lan/x", "invalid host name"),
        ("rtsp://-cam/x", "invalid host name"),
        ("rtsp://a..b/x", "invalid host name"),
        ("rtsp://no-such-host.invalid/x", "does not resolve"),
    ],
)
def test_the_default_policy_refuses_internal_targets(url: str, reason: str) -> None:
    with pytest.raises(SourceRefused, match=reason) as refused:
        DEFAULT.check(url)
    assert "s3cret" not in str(refused.value)


def test_lan_cameras_are_allowed_and_opened_at_the_checked_address() -> None:
    checked = DEFAULT.check("rtsp://user:pw@192.168.1.20:8554/cam?x=1")
    assert checked.connect_url == "rtsp://user:pw@192.168.1.20:8554/cam?x=1"
    assert checked.display_url == "rtsp://***@192.168.1.20:8554/cam?x=1"
    no_private = IngestPolicy.from_settings([], allow_private=False, own_ports=())
    with pytest.raises(SourceRefused, match="private"):
        no_private.check("rtsp://10.0.0.5/cam")


def test_names_resolve_once_and_the_source_opens_at_the_checked_address() -> None:
    loopback = IngestPolicy.from_settings(["127.0.0.0/8"], allow_private=True, own_ports=(8554,))
    checked = loopback.check("rtsp://localhost:9/x")
    assert checked.connect_url == "rtsp://127.0.0.1:9/x" and checked.address == "127.0.0.1"
    with pytest.raises(SourceRefused, match="own port"):
        loopback.check("rtsp://127.0.0.1:8554/session/x")
    with pytest.raises(SourceRefused, match="outside the networks"):
        loopback.check("rtsp://192.168.1.20/cam")


def test_errors_are_coarse_and_credentials_redacted() -> None:
    assert redact_credentials("rtsp://admin:s3cret@cam/x") == "rtsp://***@cam/x"
    for raw in ("ConnectionRefusedError: [Errno 111] Connection refused", "InvalidDataError: Invalid data", "timeout"):
        assert coarse_error(raw) == "source unavailable"
    assert coarse_error("HTTPUnauthorizedError: 401 Unauthorized") == "source refused the credentials"


def test_streams_to_refused_hosts_get_422_without_the_password(
    identity_dir: Path, pipeline_factory: PipelineFactory, tom_png: bytes
) -> None:
    settings = server_settings(identity_dir, rtsp_enabled=True, rtsp_port=0)
    with start_server(settings, pipeline_factory) as server:
        if not server.state.rtsp.available:
            pytest.skip("RTSP output unavailable")
        identity = upload(server.base_url, tom_png).json()["id"]
        body = {"source_url": "rtsp://admin:s3cret@127.0.0.1:8204/internal/admin?delete=all", "identity": identity}
        refused = httpx.post(f"{server.base_url}/v1/streams", json=body)
        assert refused.status_code == 422 and "loopback" in refused.json()["detail"]
        assert "s3cret" not in refused.text


@pytest.mark.slow
@needs_rtsp
def test_a_source_that_never_answers_fails_frees_its_slot_and_restarts(
    identity_dir: Path, pipeline_factory: PipelineFactory, tom_png: bytes
) -> None:
    settings = server_settings(
        identity_dir,
        rtsp_enabled=True,
        rtsp_port=0,
        max_streams=1,
        ingest_allowed_networks=["127.0.0.0/8"],
        stream_give_up_attempts=2,
    )
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        identity = upload(base, tom_png).json()["id"]
        body = {"source_url": "rtsp://admin:s3cret@127.0.0.1:9/x", "identity": identity}
        created = httpx.post(f"{base}/v1/streams", json=body, timeout=30)
        assert created.status_code == 201, created.text
        stream = created.json()
        assert "s3cret" not in created.text and stream["source_url"] == "rtsp://***@127.0.0.1:9/x"

        deadline = time.monotonic() + 20
        while (got := httpx.get(f"{base}/v1/streams/{stream['id']}").json())["state"] != "failed":
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        assert got["reason"] == "source unavailable: gave up retrying"
        assert "s3cret" not in httpx.get(f"{base}/v1/streams").text
        assert "Connection refused" not in str(got)

        # Its slot is free: another stream is admitted although max_streams is 1.
        other = httpx.post(f"{base}/v1/streams", json=body, timeout=30)
        assert other.status_code == 201, other.text
        full = httpx.post(f"{base}/v1/streams/{stream['id']}/restart", headers=PAGE_HEADERS, timeout=30)
        assert full.status_code == 503
        assert httpx.delete(f"{base}/v1/streams/{other.json()['id']}").status_code == 204
        restarted = httpx.post(f"{base}/v1/streams/{stream['id']}/restart", headers=PAGE_HEADERS, timeout=30)
        assert restarted.status_code == 200 and restarted.json()["state"] != "failed", restarted.text
        again = httpx.post(f"{base}/v1/streams/{stream['id']}/restart", headers=PAGE_HEADERS, timeout=30)
        assert again.status_code == 409


class _RtspResponder(LoopbackServer):
    """A hostile RTSP source on loopback: answers every request with `status` (a redirect to an internal port)."""

    def __init__(self, status: bytes) -> None:
        self._status = status
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(2)
            try:
                request = conn.recv(4096)
            except OSError:
                return
            conn.sendall(
                reply_head(self._status, request)
                + b"Location: rtsp://127.0.0.1:8204/internal/admin\r\nContent-Length: 0\r\n\r\n"
            )


def test_sources_that_redirect_are_refused() -> None:
    loopback = IngestPolicy.from_settings(["127.0.0.0/8"], allow_private=True, own_ports=())
    redirecting, plain = _RtspResponder(b"RTSP/1.0 302 Moved Temporarily"), _RtspResponder(b"RTSP/1.0 404 Not Found")
    try:
        with pytest.raises(SourceRefused, match="redirects"):
            refuse_redirects(loopback.check(f"rtsp://user:pw@127.0.0.1:{redirecting.port}/cam"))
        refuse_redirects(loopback.check(f"rtsp://127.0.0.1:{plain.port}/cam"))  # not a redirect: left to ingest
        refuse_redirects(loopback.check(f"rtsp://127.0.0.1:{free_port()}/cam"))  # closed: left to ingest
    finally:
        redirecting.close()
        plain.close()


@needs_rtsp
def test_a_stream_from_a_redirecting_source_is_refused(
    identity_dir: Path, pipeline_factory: PipelineFactory, tom_png: bytes
) -> None:
    settings = server_settings(identity_dir, rtsp_enabled=True, rtsp_port=0, ingest_allowed_networks=["127.0.0.0/8"])
    redirecting = _RtspResponder(b"RTSP/1.0 302 Moved Temporarily")
    try:
        with start_server(settings, pipeline_factory) as server:
            identity = upload(server.base_url, tom_png).json()["id"]
            body = {"source_url": f"rtsp://127.0.0.1:{redirecting.port}/cam", "identity": identity}
            refused = httpx.post(f"{server.base_url}/v1/streams", json=body, timeout=30)
            assert refused.status_code == 422 and "redirects" in refused.json()["detail"]
            assert httpx.get(f"{server.base_url}/v1/streams").json()["streams"] == []
    finally:
        redirecting.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _CountingProxy(LoopbackServer):
    """A TCP relay in front of a real RTSP server that counts the DESCRIBE requests passing through it."""

    def __init__(self, upstream_port: int) -> None:
        self.describes = 0
        self._upstream = upstream_port
        super().__init__()

    def handle(self, conn: socket.socket) -> None:
        server = socket.create_connection(("127.0.0.1", self._upstream))
        threading.Thread(target=self._relay, args=(conn, server, True), daemon=True).start()
        threading.Thread(target=self._relay, args=(server, conn, False), daemon=True).start()

    def _relay(self, source: socket.socket, sink: socket.socket, requests: bool) -> None:
        with source:
            while not self._stop.is_set():
                try:
                    data = source.recv(65536)
                    if not data:
                        break
                    if requests:
                        self.describes += data.count(b"DESCRIBE rtsp://")
                    sink.sendall(data)
                except OSError:
                    break
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


@pytest.mark.slow
@needs_rtsp
def test_creating_a_stream_asks_the_source_for_its_description_once_before_ingest_opens_it(
    identity_dir: Path, pipeline_factory: PipelineFactory, tom_png: bytes, astronaut: Image
) -> None:
    """A real RTSP source (gst-rtsp-server) sees one DESCRIBE from the redirect check and one from FFmpeg's open."""
    frame = np.ascontiguousarray(cv2.resize(astronaut, (320, 240), interpolation=cv2.INTER_AREA))
    stop = threading.Event()
    with RtspServer(port=0) as camera:
        publisher = camera.publish("camera", 320, 240, 15)

        def feed() -> None:
            while not stop.wait(1 / 15):
                publisher.push(frame)

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        proxy = _CountingProxy(int(urlsplit(camera.url("camera")).port or 0))
        settings = server_settings(
            identity_dir, rtsp_enabled=True, rtsp_port=0, ingest_allowed_networks=["127.0.0.0/8"]
        )
        try:
            with start_server(settings, pipeline_factory) as server:
                base = server.base_url
                stream = start_stream(base, tom_png, f"rtsp://127.0.0.1:{proxy.port}/camera")
                deadline = time.monotonic() + 20
                while (got := httpx.get(f"{base}/v1/streams/{stream}").json())["stats"].get("frames_in", 0) < 5:
                    assert time.monotonic() < deadline, got
                    time.sleep(0.1)
                assert got["stats"]["reconnects"] == 0, got
                assert proxy.describes == 2
        finally:
            stop.set()
            feeder.join(5)
            proxy.close()
            publisher.close()
