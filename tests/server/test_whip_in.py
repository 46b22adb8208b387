"""FFmpeg's WHIP muxer (through PyAV) as the camera, a WHIP client that is not aiortc, as OBS's WHIP output is:
a send-only offer with a Bearer key into `/v1/sessions` with a channel, and the channel's RTSP output shows the
swapped frames."""

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.auth.keys import KeyStore
from app.auth.settings import AccessSettings
from app.media.clips import MotionClip
from app.media.rtsp_out import rtsp_unavailable_reason
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.channel_clients import RtspConsumer, banded
from tests.server.credentials import bearer
from tests.server.harness import server_settings, start_server, upload
from tests.server.test_channels import USER
from tests.server.whip_publisher import WhipPublisher, whip_unavailable_reason

UNAVAILABLE = rtsp_unavailable_reason() or whip_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"cannot run: {UNAVAILABLE}")


@pytest.mark.slow
def test_ffmpeg_whip_publishes_into_a_channel(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, clip: MotionClip
) -> None:
    store = KeyStore(tmp_path / "keys.json")
    key = store.create("alice", USER)[1]
    settings = server_settings(
        tmp_path / "identities",
        access=AccessSettings(keys_file=tmp_path / "keys.json", auth_failure_delay_s=0.0),
        channel_dir=tmp_path / "channels",
        rtsp_enabled=True,
        rtsp_port=0,
    )
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png", headers=bearer(key)).json()["id"]
        made = httpx.post(
            f"{server.base_url}/v1/channels", headers=bearer(key), json={"name": "obs", "width": 640, "height": 480}
        )
        assert made.status_code == 201, made.text
        rtsp = RtspConsumer(made.json()["rtsp_url"])
        url = f"{server.base_url}/v1/sessions?identity={identity}&channel=obs"
        publisher = WhipPublisher(url, key, banded(clip.frames, "red"), tmp_path)
        try:
            arrived = wait_for(lambda: rtsp.seen.first("red") is not None or publisher.failed, 60)
            assert arrived and not publisher.failed, (publisher.output(), rtsp.seen.errors)
        finally:
            publisher.stop()
            rtsp.stop()
        time.sleep(0)
