"""A channel's addresses and credentials outlive the server: after a restart the RTSP URL and the viewer token
that OBS was given still work (the consumer gets the slate until somebody publishes); after a rotation the
old ones do not, and a consumer playing with the old login is disconnected."""

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

import av
import httpx
import pytest

from app.auth.keys import KeyStore
from app.auth.scopes import SESSIONS
from app.auth.settings import AccessSettings
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.rtsp_in import LIVE_OPTIONS
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for, wait_for_async
from tests.server.channel_clients import RtspConsumer, WhepConsumer
from tests.server.harness import server_settings, start_server

UNAVAILABLE = rtsp_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def frames_from(url: str, count: int = 3) -> int:
    with av.open(url, options=LIVE_OPTIONS, timeout=(20, 10)) as container:
        for index, _ in enumerate(container.decode(video=0), start=1):
            if index >= count:
                return index
    return 0


async def whep_status(base_url: str, whep_url: str, token: str) -> int:
    viewer = WhepConsumer()
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        status = (await viewer.connect(http, whep_url, token)).status_code
    await viewer.close()
    return status


async def watch_until_rotated(base_url: str, channel: dict, owner: dict[str, str]) -> dict:
    """Watch the channel over WHEP with its viewer token, rotate its credentials, and see the viewer end."""
    viewer = WhepConsumer()
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        assert (await viewer.connect(http, channel["whep_url"], channel["viewer_token"])).status_code == 201
        assert await wait_for_async(lambda: len(viewer.seen.frames) > 3, 30)
        rotated = (await http.post(f"/v1/channels/{channel['name']}/rotate", headers=owner)).json()
        ended = await wait_for_async(lambda: viewer.pc.connectionState in ("closed", "failed"), 20)
    await viewer.close()
    return {"rotated": rotated, "ended": ended}


@pytest.mark.slow
def test_urls_and_credentials_survive_a_restart_and_rotation_ends_them(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    keys_file = tmp_path / "keys.json"
    key = KeyStore(keys_file).create("streamer", [SESSIONS])[1]
    owner = {"Authorization": f"Bearer {key}"}
    access = AccessSettings(keys_file=keys_file, auth_failure_delay_s=0.0)
    settings = server_settings(tmp_path / "identities", rtsp_enabled=True, rtsp_port=free_port(), access=access)
    with start_server(settings, pipeline_factory) as server:
        body = {"name": "desk-cam", "width": 320, "height": 240}
        created = httpx.post(f"{server.base_url}/v1/channels", json=body, headers=owner)
        assert created.status_code == 201, created.text
        channel = created.json()
        assert frames_from(channel["rtsp_url"]) == 3  # the slate, while nobody publishes
    secrets_on_disk = (tmp_path / "channels" / "channels.json").read_text()
    assert channel["viewer_token"] not in secrets_on_disk and channel["rtsp_url"].split("@")[0] not in secrets_on_disk
    assert oct((tmp_path / "channels" / "secret").stat().st_mode & 0o777) == "0o600"

    with start_server(settings, pipeline_factory) as server:  # the same settings, as after `swapcast serve` again
        listed = httpx.get(f"{server.base_url}/v1/channels", headers=owner).json()["channels"]
        assert [c["name"] for c in listed] == ["desk-cam"] and listed[0]["rtsp_url"] == channel["rtsp_url"]
        assert frames_from(channel["rtsp_url"]) == 3
        assert asyncio.run(whep_status(server.base_url, channel["whep_url"], channel["viewer_token"])) == 201

        playing = RtspConsumer(channel["rtsp_url"])
        assert wait_for(lambda: len(playing.seen.frames) > 3, 30), playing.seen.errors
        watching = asyncio.run(watch_until_rotated(server.base_url, channel, owner))
        rotated = watching["rotated"]
        assert watching["ended"], "the WHEP viewer opened with the old token was not disconnected"
        assert rotated["rtsp_url"] != channel["rtsp_url"] and rotated["viewer_token"] != channel["viewer_token"]
        # The consumer that logged in with the old password is disconnected, and cannot come back with it.
        assert wait_for(lambda: playing.seen.errors or not playing._thread.is_alive(), 20)
        playing.stop()
        with pytest.raises(av.error.FFmpegError):
            frames_from(channel["rtsp_url"])
        assert asyncio.run(whep_status(server.base_url, channel["whep_url"], channel["viewer_token"])) == 401
        assert frames_from(rotated["rtsp_url"]) == 3
        assert asyncio.run(whep_status(server.base_url, channel["whep_url"], rotated["viewer_token"])) == 201

    with start_server(settings, pipeline_factory) as server:  # rotated credentials are the ones that last
        with pytest.raises(av.error.FFmpegError):
            frames_from(channel["rtsp_url"])
        assert frames_from(rotated["rtsp_url"]) == 3
        assert httpx.delete(f"{server.base_url}/v1/channels/desk-cam", headers=owner).status_code == 204
        with pytest.raises(av.error.FFmpegError):
            frames_from(rotated["rtsp_url"])
        assert asyncio.run(whep_status(server.base_url, channel["whep_url"], rotated["viewer_token"])) in (401, 404)
