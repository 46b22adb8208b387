"""Slow and idle clients cannot hold the server: header deadline, idle keep-alive, connection caps per client and
in total, and /healthz still answers during a slow-client flood (loopback only, bounded loops)."""

import socket
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import RunningServer, server_settings, start_server

PARTIAL = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
# Long enough that the first flood is still held while the second one connects on a loaded machine; the slot
# count below is only meaningful while no flood connection has reached its deadline yet.
HEADER_TIMEOUT_S = 8.0


def _slow_clients(port: int, count: int, source: str) -> tuple[list[socket.socket], int]:
    """`count` connections from `source` that send part of a request's headers: (held ones, refused count)."""
    opened = []
    for _ in range(count):
        conn = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
        conn.sendall(PARTIAL)
        opened.append(conn)
    time.sleep(0.5)
    held, refused = [], 0
    for conn in opened:
        conn.settimeout(0.05)
        try:
            reply = conn.recv(256)
        except TimeoutError:
            held.append(conn)
            continue
        assert reply.startswith(b"HTTP/1.1 503"), reply
        refused += 1
        conn.close()
    return held, refused


def _closed_by_server(conn: socket.socket, within_s: float) -> bool:
    conn.settimeout(within_s)
    try:
        return conn.recv(256) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _healthz_from(server: RunningServer, source: str) -> float:
    started = time.monotonic()
    with httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=5) as client:
        assert client.get(f"{server.base_url}/healthz").status_code == 200
    return time.monotonic() - started


@pytest.mark.slow
def test_slow_clients_are_capped_and_cut_off_while_healthz_answers(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    settings = server_settings(
        identity_dir,
        header_timeout_s=HEADER_TIMEOUT_S,
        keep_alive_s=1.0,
        max_connections=30,
        max_connections_per_client=20,
    )
    with start_server(settings, pipeline_factory) as server:
        flood_started = time.monotonic()
        flood, refused = _slow_clients(server.port, 60, "127.0.0.1")
        try:
            assert len(flood) == 20 and refused == 40
            assert _healthz_from(server, "127.0.0.2") < 2.0
            others, others_refused = _slow_clients(server.port, 15, "127.0.0.3")
            flood += others
            assert time.monotonic() - flood_started < HEADER_TIMEOUT_S, "the machine was too slow to count slots"
            assert len(others) <= 10 and others_refused >= 5  # 30 in total
            assert all(_closed_by_server(conn, HEADER_TIMEOUT_S + 2.0) for conn in flood)
        finally:
            for conn in flood:
                conn.close()
        assert _healthz_from(server, "127.0.0.1") < 2.0

        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as idle:
            idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert idle.recv(4096).startswith(b"HTTP/1.1 200")
            started = time.monotonic()
            assert _closed_by_server(idle, 4.0)
            assert time.monotonic() - started < 2.5


def _raw_request(port: int, head: bytes, body: bytes = b"", chunk: int = 64 * 1024) -> bytes:
    """Send `head` (and `body`) in chunks over a raw socket, stopping if the server answers or closes; the
    server's first bytes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        data = head + body
        try:
            for start in range(0, len(data), chunk):
                conn.sendall(data[start : start + chunk])
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed mid-send
        conn.settimeout(10)
        reply = b""
        try:
            while b"\r\n\r\n" not in reply:
                part = conn.recv(4096)
                if not part:
                    break
                reply += part
        except ConnectionResetError:
            pass
        return reply


@pytest.mark.slow
def test_a_header_block_over_the_cap_gets_431_before_it_is_read(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    settings = server_settings(tmp_path / "identities", max_header_bytes=16 * 1024, warmup=False)
    with start_server(settings, pipeline_factory, wait_ready=False) as server:
        port = server.port
        line = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        under = _raw_request(port, line + b"X-Fill: " + b"a" * (15 * 1024) + b"\r\n\r\n")
        assert under.startswith(b"HTTP/1.1 200"), under[:80]
        # One huge header (the probe sent 64 MB): answered 431 long before it is all sent.
        huge = _raw_request(port, line + b"X-Huge: ", b"a" * (8 * 1024 * 1024))
        assert huge.startswith(b"HTTP/1.1 431"), huge[:80]
        # Many headers adding up, and a header block that never ends.
        many = b"".join(b"X-H%d: %s\r\n" % (i, b"b" * 100) for i in range(400))
        assert _raw_request(port, line + many + b"\r\n").startswith(b"HTTP/1.1 431")
        # A large body behind small headers is the body limit's business, not the header cap's.
        body = b"x" * (200 * 1024)
        post = (
            b"POST /v1/sessions?identity=x HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/sdp\r\n"
            b"X-Swapcast: 1\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        assert not _raw_request(port, post, body).startswith(b"HTTP/1.1 431")
        # Keep-alive: a second request on the same connection is measured afresh.
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            small = line + b"X-Fill: " + b"c" * (10 * 1024) + b"\r\n\r\n"
            for _ in range(3):
                conn.sendall(small)
                reply = b""
                while b'"alive"' not in reply:
                    reply += conn.recv(4096)
                assert reply.startswith(b"HTTP/1.1 200")
