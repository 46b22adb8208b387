"""The client's RTCP feedback reaches a tapped sender's encoder: two aiortc peers in one process, the receiving
one's own receiver reports, and a NACK whose retransmission is counted against the rate."""

import asyncio
import fractions

import av
import numpy as np
from aiortc import RTCPeerConnection
from aiortc.mediastreams import MediaStreamTrack
from aiortc.rtp import RTCP_RTPFB_NACK, RtcpRtpfbPacket

from app.media.encoder import configure_encoders, install_timed_encoders
from app.media.peer import codec_preferences
from app.media.sender_feedback import tap_sender
from app.settings import EncoderSettings
from tests.helpers import wait_for_async


class NoiseTrack(MediaStreamTrack):
    """320x240 noise at 30 fps: every frame costs bits, so packets flow steadily."""

    kind = "video"

    def __init__(self) -> None:
        super().__init__()
        self._index = 0
        self._rng = np.random.default_rng(0)

    async def recv(self) -> av.VideoFrame:
        await asyncio.sleep(1 / 30)
        image = self._rng.integers(0, 255, (240, 320, 3), dtype=np.uint8)
        frame = av.VideoFrame.from_ndarray(image, format="bgr24")
        frame.pts, frame.time_base = self._index * 3000, fractions.Fraction(1, 90000)
        self._index += 1
        return frame


async def _drain(track: MediaStreamTrack) -> None:
    while True:
        await track.recv()


async def _feedback_reaches_the_encoder() -> None:
    configure_encoders(EncoderSettings(backend="x264", x264_preset="ultrafast"))
    install_timed_encoders()
    sender_pc, receiver_pc = RTCPeerConnection(), RTCPeerConnection()
    tasks: list[asyncio.Task[None]] = []
    receiver_pc.on("track", lambda track: tasks.append(asyncio.ensure_future(_drain(track))))
    try:
        transceiver = sender_pc.addTransceiver(NoiseTrack(), direction="sendonly")
        transceiver.setCodecPreferences(codec_preferences(["H264"]))  # the sessions' codec (swapcast's encoder)
        sender = transceiver.sender
        tap = tap_sender(sender)
        assert tap is not None and tap.rate_stats() is None, "no encoder before the first frame"
        await sender_pc.setLocalDescription(await sender_pc.createOffer())
        await receiver_pc.setRemoteDescription(sender_pc.localDescription)
        await receiver_pc.setLocalDescription(await receiver_pc.createAnswer())
        await sender_pc.setRemoteDescription(receiver_pc.localDescription)

        def reports() -> int:
            stats = tap.rate_stats()
            return int(stats.get("reports", 0)) if stats else 0

        # The receiving peer sends a receiver report every 0.5-1.5 s once media flows.
        assert await wait_for_async(lambda: reports() >= 2, 30.0), tap.rate_stats()
        stats = tap.rate_stats()
        assert stats is not None and stats["loss_control"] and stats["fraction_lost"] == 0.0, stats
        assert stats["reason"] == "increase", "a clean link's reports raise the rate"

        history = sender._RTCRtpSender__rtp_history  # type: ignore[attr-defined]
        newest = max(history.values(), key=lambda p: p.sequence_number)
        nack = RtcpRtpfbPacket(fmt=RTCP_RTPFB_NACK, ssrc=1234, media_ssrc=sender._ssrc)
        nack.lost = [newest.sequence_number]
        await sender._handle_rtcp_packet(nack)  # what the transport does with the client's NACK
        after = tap.rate_stats()
        assert after is not None and after["retransmit_bps"] >= len(newest.payload) * 8, after
    finally:
        for task in tasks:
            task.cancel()
        await sender_pc.close()
        await receiver_pc.close()
        configure_encoders(EncoderSettings())


def test_receiver_reports_and_nacks_reach_the_encoders_rate_control() -> None:
    asyncio.run(_feedback_reaches_the_encoder())


def test_a_sender_without_the_expected_handler_is_left_alone() -> None:
    assert tap_sender(object()) is None
