"""Protected RTSP outputs, checked with ffprobe (FFmpeg, which OBS's Media Source is built on): each session and
stream output has its own login, handed only to its owner in the URL; no login, a wrong password or another
output's login is refused by gst-rtsp-server (Digest authentication); the owner's URL plays."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from app.auth.settings import AccessSettings
from app.bench.rtc_client import RtcClient
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.credentials import bearer, make_credentials
from tests.server.harness import camera_file, server_settings, start_server, upload

UNAVAILABLE = rtsp_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")


def ffprobe(url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            "ffprobe",
            "-v",
            "error",
            "-rtsp_transport",
            "tcp",
            "-show_entries",
            "stream=codec_name,width",
            "-of",
            "csv",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def with_login(url: str, login: str | None) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{login}@{host}" if login else host))


@pytest.mark.slow
def test_each_rtsp_output_plays_only_with_its_owners_login(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
) -> None:
    video = camera_file(tmp_path, clip)
    creds = make_credentials(tmp_path / "keys.json")
    settings = server_settings(
        tmp_path / "identities",
        access=AccessSettings(keys_file=creds.keys_file, auth_failure_delay_s=0.0),
        rtsp_enabled=True,
        rtsp_port=0,
        allow_file_sources=True,
    )
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        streams = {}
        for who in (creds.owner, creds.other):
            identity = upload(base, tom_png, headers=bearer(who)).json()["id"]
            created = httpx.post(
                f"{base}/v1/streams", json={"source_url": str(video), "identity": identity}, headers=bearer(who)
            )
            assert created.status_code == 201, created.text
            streams[who] = created.json()
        mine, theirs = streams[creds.owner], streams[creds.other]
        url = mine["rtsp_url"]
        login = urlsplit(url).netloc.rsplit("@", 1)[0]
        user = login.split(":", 1)[0]
        assert ":" in login and urlsplit(theirs["rtsp_url"]).username != user
        info = httpx.get(f"{base}/v1/server", headers=bearer(creds.owner)).json()
        assert "@" not in info["rtsp"]["base_url"]

        their_login = urlsplit(theirs["rtsp_url"]).netloc.rsplit("@", 1)[0]
        refused = {  # a valid login for another path does not even learn that this path exists
            "no login": (ffprobe(with_login(url, None)), "401 Unauthorized"),
            "wrong password": (ffprobe(with_login(url, f"{user}:not-the-password")), "401 Unauthorized"),
            "another output's login": (ffprobe(with_login(url, their_login)), "404 Not Found"),
        }
        for what, (result, answer) in refused.items():
            assert result.returncode != 0, what
            assert answer in result.stderr, (what, result.stderr)
        played = ffprobe(url)
        assert played.returncode == 0, played.stderr
        assert played.stdout.strip().startswith("stream,h264,"), played.stdout
        for who, stream in streams.items():
            assert httpx.delete(f"{base}/v1/streams/{stream['id']}", headers=bearer(who)).status_code == 204


@pytest.mark.slow
def test_a_sessions_rtsp_output_plays_only_with_its_login(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
) -> None:
    settings = server_settings(tmp_path / "identities", rtsp_enabled=True, rtsp_port=0)
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png).json()["id"]

        async def run() -> tuple[str, list[subprocess.CompletedProcess[str]]]:
            client = RtcClient(clip.frames, fps=15)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                response = await client.connect(http, f"/v1/sessions?identity={identity}")
                assert await client.wait_frames(5, 60)
                url = response.headers["x-rtsp-url"]
                results = [await asyncio.to_thread(ffprobe, u) for u in (with_login(url, None), url)]
                await client.close()
                await http.delete(client.location or "")
            return url, results

        url, (anonymous, owner) = asyncio.run(run())
        assert urlsplit(url).password
        assert anonymous.returncode != 0 and "401 Unauthorized" in anonymous.stderr
        assert owner.returncode == 0 and owner.stdout.strip().startswith("stream,h264,"), owner.stderr


def describe(port: int, path: str, conn: socket.socket, authorization: str | None = None) -> tuple[str, float]:
    """One raw RTSP DESCRIBE on `conn`: the answer's status line (with whether it carries a challenge), and
    how long the answer took."""
    request = f"DESCRIBE rtsp://127.0.0.1:{port}{path} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\n"
    if authorization:
        request += f"Authorization: {authorization}\r\n"
    started = time.monotonic()
    conn.sendall((request + "\r\n").encode())
    reply = conn.recv(4096).decode(errors="replace")
    challenge = " + challenge" if "WWW-Authenticate: Digest" in reply else ""
    return reply.split("\r\n", 1)[0] + challenge, time.monotonic() - started


@pytest.mark.slow
def test_unknown_paths_answer_like_protected_ones_and_failed_logins_slow_down(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
) -> None:
    video = camera_file(tmp_path, clip)
    settings = server_settings(
        tmp_path / "identities",
        access=AccessSettings(auth_failure_delay_s=0.2, auth_failure_delay_max_s=2.0),
        rtsp_enabled=True,
        rtsp_port=0,
        allow_file_sources=True,
    )
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        identity = upload(base, tom_png).json()["id"]
        created = httpx.post(f"{base}/v1/streams", json={"source_url": str(video), "identity": identity})
        assert created.status_code == 201, created.text
        url = urlsplit(created.json()["rtsp_url"])
        port = url.port or 554
        # No existence oracle: a published path, an unpublished one shaped like it, and anything else answer
        # the same 401 with the same challenge.
        answers = set()
        for path in (url.path, "/stream/" + "0" * 32, "/session/nope", "/anything/else", "/"):
            with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
                answers.add(describe(port, path, conn)[0])
        assert answers == {"RTSP/1.0 401 Unauthorized + challenge"}
        assert "401 Unauthorized" in ffprobe(f"rtsp://127.0.0.1:{port}/stream/not-a-stream").stderr

        # Failed logins from one address wait longer each time (0.2 s per failure in the last minute).
        wrong = f'Digest username="{url.username}", realm="swapcast", nonce="x", uri="{url.path}", response="0"'
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            first, _ = describe(port, url.path, conn)  # the challenge every client gets first: not a failure
            waits = [describe(port, url.path, conn, wrong)[1] for _ in range(4)]
        assert first.startswith("RTSP/1.0 401")
        assert waits[0] >= 0.15 and waits[-1] >= 0.7 and waits == sorted(waits), waits
        played = ffprobe(created.json()["rtsp_url"])  # the owner's URL still plays
        assert played.returncode == 0, played.stderr
