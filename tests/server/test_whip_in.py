"""FFmpeg's WHIP muxer (through PyAV) as the camera, a WHIP client that is not aiortc, as OBS's WHIP output is:
a send-only offer without candidates and with a Bearer key into `/v1/sessions` with a channel, and the channel's
RTSP output shows the publisher's frames, swapped.

The publisher brings a P-256 certificate for its DTLS: the one FFmpeg makes by itself when built with GnuTLS is
P-224, which this server's OpenSSL refuses (docs/guides/whip-in.md); the second test keeps that measured. The
third closes the loop: a channel's WHIP push (FFmpeg's muxer again, given a P-256 certificate by the server)
is a swapcast session's camera."""

from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.auth.keys import KeyStore
from app.auth.settings import AccessSettings
from app.bench.rtc_client import stamp
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.channel_clients import RtspConsumer, banded
from tests.server.credentials import USER_SCOPES, bearer
from tests.server.harness import LOOPBACK_DESTINATIONS, RunningServer, server_settings, start_server, upload
from tests.server.test_rtsp_outputs import check_swapped, pull
from tests.server.whip_publisher import WhipPublisher, whip_unavailable_reason

UNAVAILABLE = rtsp_unavailable_reason() or whip_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"cannot run: {UNAVAILABLE}")


def stamped(frames: list[Image]) -> list[Image]:
    out = []
    for index, frame in enumerate(frames):
        image = frame.copy()
        stamp(image, index)
        out.append(image)
    return out


def keyed_server(
    root: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], **overrides: object
) -> tuple[RunningServer, str]:
    key = KeyStore(root / "keys.json").create("alice", USER_SCOPES)[1]
    settings = server_settings(
        root / "identities",
        access=AccessSettings(keys_file=root / "keys.json", auth_failure_delay_s=0.0),
        channel_dir=root / "channels",
        rtsp_enabled=True,
        rtsp_port=0,
        **(LOOPBACK_DESTINATIONS | overrides),
    )
    return start_server(settings, pipeline_factory), key


def whip_url(server: RunningServer, key: str, tom_png: bytes, channel: str = "obs") -> tuple[str, str]:
    """The WHIP endpoint of a session publishing into a new channel, and the channel's RTSP URL."""
    identity = upload(server.base_url, tom_png, "tom.png", headers=bearer(key)).json()["id"]
    made = httpx.post(
        f"{server.base_url}/v1/channels", headers=bearer(key), json={"name": channel, "width": 640, "height": 480}
    )
    assert made.status_code == 201, made.text
    return f"{server.base_url}/v1/sessions?identity={identity}&channel={channel}", made.json()["rtsp_url"]


def publisher(server: RunningServer, key: str, channel: str = "obs") -> str | None:
    """The session publishing into the channel, if any."""
    state = httpx.get(f"{server.base_url}/v1/channels/{channel}", headers=bearer(key))
    assert state.status_code == 200, state.text
    found: str | None = state.json()["publisher"]
    return found


@pytest.mark.slow
def test_ffmpeg_whip_publishes_into_a_channel_and_its_rtsp_output_is_swapped(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
    clip_faces: list[np.ndarray],
) -> None:
    server, key = keyed_server(tmp_path, pipeline_factory)
    with server:
        url, rtsp_url = whip_url(server, key, tom_png)
        camera = WhipPublisher(url, key, stamped(clip.frames), tmp_path)
        try:
            assert wait_for(lambda: publisher(server, key) is not None or camera.failed, 60), camera.output()
            assert not camera.failed, camera.output()
            frames = pull(rtsp_url, 45)
            assert not camera.failed, camera.output()
        finally:
            camera.stop()
    check_swapped(frames, clip, clip_faces)


@pytest.mark.slow
def test_ffmpegs_own_p224_certificate_is_refused_with_a_failed_dtls_handshake(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, clip: MotionClip
) -> None:
    """The limit docs/guides/whip-in.md describes: when this starts failing, the guide's workaround is moot."""
    server, key = keyed_server(tmp_path, pipeline_factory)
    with server:
        url, _ = whip_url(server, key, tom_png)
        camera = WhipPublisher(url, key, clip.frames, tmp_path, p256=False)
        try:
            assert wait_for(lambda: camera.failed, 60)
            assert publisher(server, key) is None
        finally:
            camera.stop()
    assert "DTLS session failed" in camera.output(), camera.output()


@pytest.mark.slow
def test_a_whip_push_reaches_a_swapcast_session_as_its_camera(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, clip: MotionClip
) -> None:
    """Channel "studio" (FFmpeg's WHIP camera) pushes over WHIP, with the Bearer key, into a session of the same
    server publishing into channel "obs": swapcast's WHIP push and its WHIP ingest, end to end."""
    server, key = keyed_server(tmp_path, pipeline_factory, max_sessions=3, push_retry_s=0.5, push_retry_max_s=2.0)
    with server:
        studio_url, _ = whip_url(server, key, tom_png, "studio")
        obs_url, obs_rtsp = whip_url(server, key, tom_png, "obs")
        added = httpx.post(
            f"{server.base_url}/v1/channels/studio/pushes", headers=bearer(key), json={"url": obs_url, "key": key}
        )
        assert added.status_code == 201, added.text
        push_id = added.json()["id"]

        def push_stats() -> dict:
            url = f"{server.base_url}/v1/channels/studio/pushes/{push_id}"
            return dict(httpx.get(url, headers=bearer(key)).json())

        camera = WhipPublisher(studio_url, key, banded(clip.frames, "red"), tmp_path)
        reader = RtspConsumer(obs_rtsp)
        try:
            arrived = wait_for(lambda: reader.seen.first("red") is not None or camera.failed, 90)
            assert arrived and not camera.failed, (camera.output(), push_stats(), reader.seen.errors)
            assert publisher(server, key, "obs") is not None
            assert wait_for(lambda: push_stats()["state"] == "live", 30), push_stats()
            stats = push_stats()
            assert stats["frames_sent"] > 0 and stats["connects"] >= 1, stats
            assert key not in str(stats)
        finally:
            reader.stop()
            camera.stop()
