"""The offer checks of `app.media.peer` on real aiortc offers: a session's camera must list a candidate, a WHEP
viewer may list none (a page without camera permission hides its addresses behind mDNS names), and so may a
send-only publisher (a WHIP client)."""

import asyncio

import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from app.bench.rtc_client import StampedTrack
from app.media.peer import OfferError, Role, check_offer


def offer(viewer: bool, direction: str = "sendrecv") -> str:
    async def make() -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        if viewer:
            pc.addTransceiver("video", direction="recvonly")
        else:
            pc.addTransceiver(StampedTrack([np.zeros((48, 64, 3), np.uint8)]), direction=direction)
        await pc.setLocalDescription(await pc.createOffer())
        text = str(pc.localDescription.sdp)
        await pc.close()
        return text

    return asyncio.run(make())


def without_candidates(sdp: str) -> str:
    return "\r\n".join(line for line in sdp.split("\r\n") if not line.startswith("a=candidate:"))


def test_a_viewer_offer_without_candidates_passes_and_a_camera_offer_without_them_does_not() -> None:
    check_offer(without_candidates(offer(viewer=True)), role=Role.VIEWER)
    with pytest.raises(OfferError, match="no ICE candidates"):
        check_offer(without_candidates(offer(viewer=False)), role=Role.SENDER)
    with pytest.raises(OfferError, match="a viewer receives"):
        check_offer(offer(viewer=False), role=Role.VIEWER)


def test_a_send_only_publisher_may_list_no_candidates() -> None:
    """WHIP ingest clients that only publish (FFmpeg's WHIP muxer) connect to the answer's candidates."""
    check_offer(without_candidates(offer(viewer=False, direction="sendonly")), role=Role.SENDER)
