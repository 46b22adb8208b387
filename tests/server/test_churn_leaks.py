"""Clients that join and leave leave nothing behind: after real sessions and WHEP viewers come and go, no
session, viewer, hub, live core or peer connection of theirs is still alive, the event loop holds no task
for them and the heap they freed is handed back to the system; and a viewer whose output ends while it is
being negotiated is refused, not kept forever."""

import asyncio
import gc
from collections import Counter

import httpx
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from app.bench.rtc_client import RtcClient
from app.egress.whep import Viewer
from app.media.clips import MotionClip
from app.media.peer import OfferError
from tests.helpers import wait_for
from tests.server.harness import RunningServer, upload
from tests.server.whep_client import WhepReceiver

# What one session or viewer of the server is made of; none may outlive its client.
PER_CLIENT_TYPES = ("Session", "Viewer", "ViewerHub", "LiveCore", "RTCPeerConnection", "RTCDtlsTransport")


def live_objects() -> Counter[str]:
    gc.collect()
    wanted = set(PER_CLIENT_TYPES)
    return Counter(name for o in gc.get_objects() if (name := type(o).__name__) in wanted)


def viewer_offer() -> str:
    async def make() -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = str(pc.localDescription.sdp)
        await pc.close()
        return sdp

    return asyncio.run(make())


def test_a_viewer_negotiated_while_its_output_ends_is_refused(server: RunningServer) -> None:
    offer = viewer_offer()

    async def race() -> tuple[Viewer | None, str | None, bool]:
        ended = asyncio.Event()
        listeners: list[object] = []
        viewers = server.state.viewers
        adding = asyncio.ensure_future(viewers.add("session/ended-meanwhile", offer, listeners, ended))  # type: ignore[arg-type]
        await asyncio.sleep(0)  # the hub is made and the negotiation has begun
        ended.set()  # the output ends: its hub closes while the viewer is still negotiated
        try:
            viewer, _ = await adding
        except OfferError as exc:
            return None, str(exc), bool(listeners)
        return viewer, None, bool(listeners)

    viewer, refused, listening = server.call(race, timeout=30)
    assert viewer is None, "a viewer of an output that had ended was kept, and nothing would ever end it"
    assert refused is not None and "has ended" in refused
    assert not listening
    assert server.state.viewers.hub("session/ended-meanwhile") is None


@pytest.mark.slow
@pytest.mark.alone
def test_sessions_and_viewers_that_leave_leave_nothing_alive(
    server: RunningServer, tom_png: bytes, clip: MotionClip
) -> None:
    response = upload(server.base_url, tom_png, "tom.png")
    assert response.status_code == 201, response.text
    identity = response.json()["id"]
    tasks_before = server.task_names()
    trims_before = server.state.heap.trims

    async def churn(cycles: int) -> int:
        returned = 0
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            for _ in range(cycles):
                client = RtcClient(clip.frames, fps=15)
                viewer = WhepReceiver()
                try:
                    await client.connect(http, f"/v1/sessions?identity={identity}")
                    assert client.location is not None
                    answered = await viewer.connect(http, f"{client.location}/whep")
                    assert answered.status_code == 201, answered.text
                    returned += await client.wait_frames(3, 20)
                finally:
                    if viewer.location:
                        await http.delete(viewer.location)
                    await viewer.close()
                    if client.location:
                        await http.delete(client.location)
                    await client.close()
        return returned

    before = live_objects()
    assert asyncio.run(churn(3)) == 3
    settled = wait_for(lambda: not live_objects() - before, 20)
    left = live_objects() - before
    assert settled, f"still alive after every client left: {dict(left)}"
    # What they freed was handed back to the system once they had ended (glibc; elsewhere nothing is done).
    if server.state.heap.available:
        assert wait_for(lambda: server.state.heap.trims > trims_before, 10)
    assert wait_for(lambda: server.task_names() == tasks_before, 10), (
        f"tasks left on the server's loop: {sorted(set(server.task_names()) - set(tasks_before))}"
    )
