"""WHEP abuse: viewers go through the same peer checks as sessions (candidate cap, ICE deadline, advertised
address), at most `max_viewers_per_output` per output, and viewer creation is rate limited per principal."""

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.bench.rtc_client import RtcClient
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for_async
from tests.server.harness import server_settings, start_server, upload
from tests.server.test_bad_input import real_offer

SDP = {"Content-Type": "application/sdp"}
PipelineFactory = Callable[[PipelineSettings], FramePipeline]
PUBLIC = "203.0.113.10"  # TEST-NET: the address a NAT in front of the server would forward


@pytest.fixture(scope="module")
def offer() -> str:
    return real_offer()


def test_viewer_offers_are_checked_capped_per_output_and_rate_limited(
    identity_dir: Path, pipeline_factory: PipelineFactory, offer: str, tom_png: bytes
) -> None:
    """A canned session to watch (alive until its ICE timeout); canned receive-only viewer offers."""
    settings = server_settings(
        identity_dir,
        max_viewers_per_output=2,
        rate_viewers="5/minute",
        ice_timeout_s=15.0,
        advertised_address=PUBLIC,
    )
    viewer_offer = offer.replace("a=sendrecv", "a=recvonly")
    lines = "".join(f"a=candidate:{i} 1 udp 2122260223 127.0.0.1 {20000 + i} typ host\r\n" for i in range(300))
    flood = viewer_offer.replace("a=end-of-candidates", lines + "a=end-of-candidates", 1)
    assert flood != viewer_offer
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        identity = upload(base, tom_png).json()["id"]
        session = httpx.post(f"{base}/v1/sessions?identity={identity}", content=offer, headers=SDP, timeout=30)
        assert session.status_code == 201, session.text
        whep = f"{base}{session.headers['location']}/whep"

        def post(body: str) -> httpx.Response:
            return httpx.post(whep, content=body, headers=SDP, timeout=30)

        sending = post(offer)  # a session's offer: it sends video, a viewer only receives
        assert sending.status_code == 400 and "recvonly" in sending.json()["detail"]
        flooded = post(flood)
        assert flooded.status_code == 400 and "at most 16" in flooded.json()["detail"]
        admitted = [post(viewer_offer) for _ in range(2)]
        assert [r.status_code for r in admitted] == [201, 201], [r.text for r in admitted]
        assert all(f" {PUBLIC} " in r.text and " 127.0.0.1 " not in r.text for r in admitted)
        full = post(viewer_offer)
        assert full.status_code == 503 and "2 viewers" in full.json()["detail"]
        assert int(full.headers["Retry-After"]) >= 1
        limited = post(viewer_offer)
        assert limited.status_code == 429 and "viewers" in limited.json()["detail"]
        assert int(limited.headers["Retry-After"]) >= 1
        assert len(httpx.get(whep).json()["viewers"]) == 2
        limits = httpx.get(f"{base}/v1/server").json()["limits"]
        assert limits["max_viewers_per_output"] == 2 and limits["rates"]["viewers"] == "5/minute"


@pytest.mark.slow
def test_a_viewer_that_never_completes_ice_is_gone_after_the_ice_timeout(
    identity_dir: Path, pipeline_factory: PipelineFactory, offer: str, tom_png: bytes, clip: MotionClip
) -> None:
    """A real client keeps its session up; a canned viewer offer has no peer behind it."""
    settings = server_settings(identity_dir, ice_timeout_s=2.0)
    viewer_offer = offer.replace("a=sendrecv", "a=recvonly")
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png).json()["id"]

        async def run() -> tuple[int, float, int]:
            client = RtcClient(clip.frames, fps=15)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                await client.connect(http, f"/v1/sessions?identity={identity}")
                assert client.location is not None
                assert await client.wait_frames(3, 90)
                whep = f"{client.location}/whep"
                answered = await http.post(whep, content=viewer_offer, headers=SDP)
                assert answered.status_code == 201, answered.text
                started = time.monotonic()
                listed = len((await http.get(whep)).json()["viewers"])
                gone = await wait_for_async(lambda: not server.state.viewers.all(), 10)
                waited = time.monotonic() - started
                session = await http.get(client.location)
                await client.close()
            assert gone
            return listed, waited, session.status_code

        listed, waited, session_status = asyncio.run(run())
    assert listed == 1
    assert 1.0 <= waited <= 5.0, waited
    assert session_status == 200, "the session should outlive its viewer"
