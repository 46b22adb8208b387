"""A WHEP viewer's video sender bounds a plain aiortc viewer's freeze by itself, as a session's return does
(app.egress.whep, app.media.sender_recovery): a viewer hub fed noise, a receive-only aiortc peer that offers as
any WHEP player does, and scripted drops between them (tests/media/return_drops.py)."""

import asyncio
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.rtp import RtpPacket, is_rtcp

from app.egress.whep import Viewer, ViewerHub
from app.live.frame import OutputFrame
from app.media.encoder import EncoderPolicy
from app.media.peer import PeerConfig, use_host_addresses
from app.settings import EncoderSettings
from tests.helpers import wait_for_async
from tests.media.return_drops import WATCH_S, Drops, filter_sent, longest_gap, watch_frames


@dataclass
class Watched:
    hub: ViewerHub
    viewer: Viewer
    client: RTCPeerConnection
    arrivals: list[float] = field(default_factory=list)


async def _feed(hub: ViewerHub) -> None:
    """320x240 noise at 30 fps: every frame costs bits, so packets flow steadily."""
    rng = np.random.default_rng(0)
    while True:
        hub.offer(OutputFrame(rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)))
        await asyncio.sleep(1 / 30)


@asynccontextmanager
async def _watching(settings: EncoderSettings, without_nack: bool = False) -> AsyncIterator[Watched]:
    """One viewer of a fed hub, its frames decoded on a plain aiortc client; `without_nack`: the client's offer
    does not ask for packets (keyframe requests only, as GStreamer's webrtcbin by default)."""
    use_host_addresses(["127.0.0.1"])
    hub = ViewerHub("whep-recovery", asyncio.get_running_loop(), PeerConfig(), EncoderPolicy(settings))
    client = RTCPeerConnection()
    arrivals: list[float] = []
    tasks = [asyncio.ensure_future(_feed(hub))]
    client.on("track", lambda track: tasks.append(asyncio.ensure_future(watch_frames(track, arrivals))))
    try:
        client.addTransceiver("video", direction="recvonly")
        await client.setLocalDescription(await client.createOffer())
        offer = client.localDescription.sdp
        if without_nack:
            offer = re.sub(r"a=rtcp-fb:\d+ nack\r\n", "", offer)
        viewer, answer = await hub.add_viewer(offer)
        await client.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        assert await wait_for_async(lambda: len(arrivals) >= 10, 30.0), "no frames on a clean link"
        yield Watched(hub, viewer, client, arrivals)
    finally:
        for task in tasks:
            task.cancel()
        with suppress(Exception):
            await hub.close()
        await client.close()


async def _viewer_through_drops(recovery: bool) -> tuple[float, Drops, Viewer]:
    """The longest time the viewer went without a frame in the `WATCH_S` after the first drop."""
    settings = EncoderSettings(backend="x264", x264_preset="ultrafast", return_recovery=recovery)
    async with _watching(settings) as watched:
        sender = watched.viewer.pc.getTransceivers()[0].sender
        drops = Drops(sender)
        filter_sent(sender.transport, drops.server_keeps)
        filter_sent(watched.client.getReceivers()[0].transport, drops.client_keeps)
        drops.armed = True
        assert await wait_for_async(lambda: drops.x is not None, 5.0)
        start = time.monotonic()
        await asyncio.sleep(WATCH_S)
        return longest_gap(watched.arrivals, start, time.monotonic()), drops, watched.viewer


def test_a_whep_viewer_that_loses_a_retransmission_and_a_nack_freezes_under_half_a_second() -> None:
    longest, drops, viewer = asyncio.run(_viewer_through_drops(recovery=True))
    assert drops.dropped == ["media X", "rtx X", "media Y", "nack Y"], drops.dropped
    assert viewer.recovery is not None and viewer.recovery.peer_nacks is True
    counts = viewer.recovery.counts
    assert counts.probes >= 1, counts
    assert counts.resent >= 3, counts  # X twice (the first was lost), Y once its NACK came again
    assert longest <= 0.5, f"the viewer went {longest:.2f} s without a frame; {counts}"
    stats = viewer.stats()["return_recovery"]
    assert isinstance(stats, dict) and stats["resent"] == counts.resent


def test_with_the_recovery_switched_off_the_same_losses_freeze_a_whep_viewer_for_seconds() -> None:
    """aiortc's sender alone (SWAPCAST_ENCODER_RETURN_RECOVERY=false): X's answer is lost, nothing asks again."""
    longest, drops, _ = asyncio.run(_viewer_through_drops(recovery=False))
    assert drops.dropped[:2] == ["media X", "rtx X"], drops.dropped
    assert longest > 2.0, f"longest gap {longest:.2f} s"


def test_a_whep_viewer_that_cannot_ask_for_packets_gets_a_keyframe_of_the_shared_encode_under_loss() -> None:
    asyncio.run(_without_nack())


async def _without_nack() -> None:
    settings = EncoderSettings(backend="x264", x264_preset="ultrafast", keyframe_interval_s=10.0)
    async with _watching(settings, without_nack=True) as watched:
        viewer = watched.viewer
        assert viewer.recovery is not None and viewer.recovery.peer_nacks is False
        sender = viewer.pc.getTransceivers()[0].sender
        keyframes: list[float] = []
        deliver = viewer.track.deliver

        def counted(packet: object, keyframe: bool, handed_at: float | None = None) -> None:
            if keyframe:
                keyframes.append(time.monotonic())
            deliver(packet, keyframe, handed_at)  # type: ignore[arg-type]

        viewer.track.deliver = counted  # type: ignore[method-assign]
        lost = [0]

        def keeps(data: bytes) -> bool:  # every 20th media packet is lost
            if is_rtcp(data) or RtpPacket.parse(data).ssrc != sender._ssrc:
                return True
            lost[0] += 1
            return lost[0] % 20 != 0

        filter_sent(sender.transport, keeps)
        assert await wait_for_async(lambda: viewer.keyframes_for_loss >= 3, 10.0), viewer.keyframes_for_loss
        assert len(keyframes) >= 2, "the shared encode sent no keyframe for the viewer's loss"
