"""Channels through the API on a keyed server: made once, owner-scoped, published into by sessions (the newest
taking over, the older ended), and deleted with their publisher. (RTSP and the consumers' view of a switch:
`test_channel_switch.py`; restarts and rotation: `test_channel_restart.py`.)"""

import asyncio
from collections.abc import Callable, Iterator

import httpx
import pytest

from app.bench.rtc_client import RtcClient
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for_async
from tests.server.credentials import TwoUsers, bearer, two_users_server
from tests.server.harness import upload

Keyed = TwoUsers


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> Iterator[Keyed]:
    root = tmp_path_factory.mktemp("channels")
    with two_users_server(root, pipeline_factory, max_sessions=4, max_channels_per_principal=3) as keyed:
        yield keyed


def test_a_channel_is_made_once_and_seen_only_by_its_owner(keyed: Keyed) -> None:
    made = keyed.call("POST", "/v1/channels", keyed.alice, json={"name": "alice-live"})
    assert made.status_code == 201, made.text
    channel = made.json()
    assert made.headers["location"] == "/v1/channels/alice-live"
    assert channel["whep_url"] == "/v1/channels/alice-live/whep"
    assert channel["view_url"] == f"/view/channel/alice-live?token={channel['viewer_token']}"
    assert (channel["width"], channel["height"], channel["fps"]) == (1280, 720, 30)
    assert channel["rtsp_url"] is None  # this server has no RTSP output
    assert channel["srt_url"] is None  # nor an SRT port
    assert channel["publisher"] is None and channel["showing"] == "slate"

    taken = keyed.call("POST", "/v1/channels", keyed.bob, json={"name": "alice-live"})
    assert taken.status_code == 409 and "taken" in taken.json()["detail"]
    for body in ({"name": "Alice Live"}, {"name": "../x"}, {"name": "ok", "width": 641}, {"name": "ok", "extra": 1}):
        assert keyed.call("POST", "/v1/channels", keyed.bob, json=body).status_code == 422, body

    assert keyed.call("GET", "/v1/channels/alice-live", keyed.bob).status_code == 404
    assert keyed.call("POST", "/v1/channels/alice-live/rotate", keyed.bob).status_code == 404
    assert keyed.call("DELETE", "/v1/channels/alice-live", keyed.bob).status_code == 404
    assert [c["name"] for c in keyed.call("GET", "/v1/channels", keyed.bob).json()["channels"]] == []
    assert "alice-live" in [c["name"] for c in keyed.call("GET", "/v1/channels", keyed.alice).json()["channels"]]


def test_an_owner_holds_a_bounded_number_of_channels(keyed: Keyed) -> None:
    names = [f"bob-{n}" for n in range(3)]
    for name in names:
        assert keyed.call("POST", "/v1/channels", keyed.bob, json={"name": name}).status_code == 201
    refused = keyed.call("POST", "/v1/channels", keyed.bob, json={"name": "bob-3"})
    assert refused.status_code == 409 and "most" in refused.json()["detail"]
    for name in names:
        assert keyed.call("DELETE", f"/v1/channels/{name}", keyed.bob).status_code == 204
    assert keyed.call("GET", "/v1/channels", keyed.bob).json()["channels"] == []


def test_the_newest_session_takes_the_channel_over_and_deleting_it_ends_the_last(
    keyed: Keyed, tom_png: bytes, clip: MotionClip
) -> None:
    identity = upload(keyed.server.base_url, tom_png, "tom.png", headers=bearer(keyed.alice)).json()["id"]
    assert keyed.call("POST", "/v1/channels", keyed.alice, json={"name": "takeover"}).status_code == 201

    async def run() -> None:
        headers = bearer(keyed.alice)
        async with httpx.AsyncClient(base_url=keyed.server.base_url, timeout=30, headers=headers) as http:
            async with httpx.AsyncClient(base_url=keyed.server.base_url, timeout=30, headers=bearer(keyed.bob)) as bob:
                # bob's identity, alice's channel: not his, so not found
                bobs = upload(keyed.server.base_url, tom_png, "tom.png", headers=bearer(keyed.bob)).json()["id"]
                assert await refused(bob, clip, f"/v1/sessions?identity={bobs}&channel=takeover") == 404
            assert await refused(http, clip, f"/v1/sessions?identity={identity}&channel=nope") == 404
            assert [s["id"] for s in (await http.get("/v1/sessions")).json()["sessions"]] == []

            first = RtcClient(clip.frames, fps=10)
            response = await first.connect(http, f"/v1/sessions?identity={identity}&channel=takeover")
            assert response.status_code == 201 and response.headers["x-channel"] == "takeover"
            assert "x-rtsp-url" not in response.headers  # the server has no RTSP; the session has no path either
            assert await first.wait_frames(3, 60)
            channel = (await http.get("/v1/channels/takeover")).json()
            assert channel["publisher"] == f"session/{first.location.rsplit('/', 1)[1]}"  # type: ignore[union-attr]
            assert await wait_for_async(
                lambda: keyed.call("GET", "/v1/channels/takeover", keyed.alice).json()["showing"] == "published", 30
            )

            second = RtcClient(clip.frames, fps=10)
            assert (await second.connect(http, f"/v1/sessions?identity={identity}&channel=takeover")).status_code == 201
            assert await second.wait_frames(3, 60)
            assert (await http.get(first.location or "")).status_code == 404  # ended: taken over
            channel = (await http.get("/v1/channels/takeover")).json()
            assert channel["publisher"] == f"session/{(second.location or '').rsplit('/', 1)[1]}"
            assert channel["publisher_changes"] == 2

            assert (await http.delete("/v1/channels/takeover")).status_code == 204
            assert await wait_for_async(
                lambda: keyed.call("GET", second.location or "", keyed.alice).status_code == 404, 15
            )
            await first.close()
            await second.close()

    asyncio.run(run())


async def refused(http: httpx.AsyncClient, clip: MotionClip, url: str) -> int:
    """The status of a session request the server refuses."""
    client = RtcClient(clip.frames, fps=10)
    try:
        with pytest.raises(httpx.HTTPStatusError) as caught:
            await client.connect(http, url)
    finally:
        await client.pc.close()
    return caught.value.response.status_code


def test_channels_are_measured(keyed: Keyed) -> None:
    assert keyed.call("POST", "/v1/channels", keyed.alice, json={"name": "measured", "fps": 10}).status_code == 201
    metrics = httpx.get(f"{keyed.server.base_url}/metrics", headers=bearer(keyed.alice)).text
    assert 'swapcast_channel_slate_seconds_total{channel="measured"}' in metrics
    assert 'swapcast_channel_consumers{channel="measured",transport="whep"} 0.0' in metrics
    assert keyed.call("DELETE", "/v1/channels/measured", keyed.alice).status_code == 204
