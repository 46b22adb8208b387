"""OBS Studio 29 itself as the streamer's client: a Media Source pulling a channel's RTSP URL and one pulling
the channel over SRT (on the server's SRT port by stream id and the channel's passphrase, and from a listener
push, both encrypted) show the publisher's swapped frames, their coloured band kept
by the swap, in OBS's own screenshots of each source, and go on showing the channel when a new publisher takes
it over (as a reconnecting page does), with nothing changed in OBS. Skipped, with OBS's reason, where OBS cannot
start."""

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.egress.push_sinks import srt_unavailable_reason
from app.egress.rtsp import rtsp_unavailable_reason
from app.egress.srt import unavailable_reason as srt_out_unavailable_reason
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.channel_clients import banded, what_it_shows
from tests.server.harness import LOOPBACK_DESTINATIONS, server_settings, start_server, upload
from tests.server.obs import Obs, ObsDidNotStart, obs_unavailable
from tests.server.push_servers import free_port
from tests.server.test_push_delivery import SIZE, Publisher, add_push, make_channel, small

pytestmark = pytest.mark.slow
MISSING = obs_unavailable() or rtsp_unavailable_reason() or srt_unavailable_reason() or srt_out_unavailable_reason()
PASSPHRASE = "obs-srt-passphrase"


def shows(obs: Obs, source: str) -> str | None:
    """What the source shows in OBS now (a publisher's band, "other"), None while it shows nothing yet."""
    image = obs.screenshot(source, SIZE["width"])
    return what_it_shows(image) if image is not None else None


@pytest.mark.skipif(MISSING is not None, reason=f"cannot run OBS against a channel: {MISSING}")
def test_obs_shows_the_swapped_channel_over_rtsp_and_srt(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, clip: MotionClip
) -> None:
    settings = server_settings(
        tmp_path / "identities", rtsp_enabled=True, rtsp_port=0, srt_port=0, channel_hold_s=60, **LOOPBACK_DESTINATIONS
    )
    obs = Obs(tmp_path / "obs-home")
    try:
        obs.start()
    except ObsDidNotStart as exc:
        obs.stop()
        pytest.skip(f"OBS cannot start here: {exc}")
    try:
        with start_server(settings, pipeline_factory) as server:
            identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
            channel = make_channel(server, "obs")
            port = free_port()
            push = add_push(server, "obs", {"url": f"srt://:{port}?mode=listener", "passphrase": PASSPHRASE})
            publisher = Publisher(server, banded(small(clip), "red"), identity, "obs")
            try:
                scene = obs.call("GetCurrentProgramScene")["currentProgramSceneName"]
                sources = {
                    "rtsp": channel["rtsp_url"],
                    "srt": channel["srt_url"],  # the server's SRT port: stream id and the channel's passphrase
                    "srt-push": f"srt://127.0.0.1:{port}?mode=caller&passphrase={PASSPHRASE}",
                }
                for name, url in sources.items():
                    settings_of = {"is_local_file": False, "input": url, "restart_on_activate": True}
                    obs.call(
                        "CreateInput",
                        {
                            "sceneName": scene,
                            "inputName": name,
                            "inputKind": "ffmpeg_source",
                            "inputSettings": settings_of,
                        },
                    )
                for name in sources:
                    assert wait_for(lambda n=name: shows(obs, n) == "red", 90), (name, obs.log()[-1500:])
                stats = httpx.get(f"{server.base_url}/v1/channels/obs/pushes/{push['id']}", timeout=30).json()
                assert stats["state"] == "live", stats
                consumers = httpx.get(f"{server.base_url}/v1/channels/obs", timeout=30).json()["consumers"]
                assert consumers["rtsp"] >= 1 and consumers["srt"] >= 1, consumers

                # A new session takes the channel over: OBS's same sources show it, nothing touched in OBS.
                taking_over = Publisher(server, banded(small(clip), "blue"), identity, "obs")
                publisher.close()
                publisher = taking_over
                for name in sources:
                    assert wait_for(lambda n=name: shows(obs, n) == "blue", 60), (name, obs.log()[-1500:])
                channel_now = httpx.get(f"{server.base_url}/v1/channels/obs", timeout=30).json()
                assert channel_now["publisher_changes"] >= 2 and channel_now["consumers"]["rtsp"] >= 1, channel_now
                time.sleep(0.5)
            finally:
                publisher.close()
    finally:
        obs.stop()
