"""Protected RTSP outputs, checked with ffprobe (FFmpeg, which OBS's Media Source is built on): each session and
stream output has its own login, handed only to its owner in the URL; no login, a wrong password or another
output's login is refused by gst-rtsp-server (Digest authentication); the owner's URL plays."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from app.auth.settings import AccessSettings
from app.bench.rtc_client import RtcClient
from app.media.clips import MotionClip, write_clip
from app.media.rtsp_out import rtsp_unavailable_reason
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.credentials import bearer, make_credentials
from tests.server.harness import server_settings, start_server, upload

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
    video = tmp_path / "camera.mp4"
    write_clip(MotionClip(clip.frames[:15], clip.matrices[:15], clip.fps), video, audio_tone_hz=None)
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
