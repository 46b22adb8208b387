"""Scripted losses between a video sender and a plain aiortc receiver on loopback, shared by the tests of the
senders' recovery (a session's return, tests/media/test_sender_recovery.py; a WHEP viewer's,
tests/egress/test_whep_recovery.py)."""

import asyncio
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

from aiortc import RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack
from aiortc.rtp import RTCP_RTPFB_NACK, RtcpPacket, RtcpRtpfbPacket, RtpPacket, is_rtcp

from app.media.encoder import configure_encoders
from app.settings import EncoderSettings

WATCH_S = 3.0  # watched after the first drop: aiortc's buffer alone would hold frames for 512 packets


class Drops:
    """What the link loses, by rule: the server's media packet X, its first retransmission, media packet Y, and
    the client's first NACK asking for Y."""

    def __init__(self, sender: Any) -> None:
        self.sender = sender
        self.armed = False
        self.x: int | None = None
        self.y: int | None = None
        self.dropped: list[str] = []
        self._media_seen = 0

    def server_keeps(self, data: bytes) -> bool:
        if not self.armed or is_rtcp(data):
            return True
        packet = RtpPacket.parse(data)
        if packet.ssrc == self.sender._ssrc and packet.payload:
            self._media_seen += 1
            if self.x is None and self._media_seen == 5:
                self.x = packet.sequence_number
                return self._drop("media X")
            if self.y is None and self._media_seen == 40:
                self.y = packet.sequence_number
                return self._drop("media Y")
        elif packet.ssrc == self.sender._rtx_ssrc and len(packet.payload) >= 2:
            (original,) = struct.unpack("!H", packet.payload[:2])
            if original == self.x and "rtx X" not in self.dropped:
                return self._drop("rtx X")
        return True

    def client_keeps(self, data: bytes) -> bool:
        if self.y is None or "nack Y" in self.dropped or not is_rtcp(data):
            return True
        for packet in RtcpPacket.parse(data):
            if isinstance(packet, RtcpRtpfbPacket) and packet.fmt == RTCP_RTPFB_NACK and self.y in packet.lost:
                return self._drop("nack Y")
        return True

    def _drop(self, what: str) -> bool:
        self.dropped.append(what)
        return False


def filter_sent(transport: Any, keeps: Callable[[bytes], bool]) -> None:
    send = transport._send_rtp

    async def send_rtp(data: bytes) -> None:
        if keeps(data):
            await send(data)

    transport._send_rtp = send_rtp


async def watch_frames(track: MediaStreamTrack, arrivals: list[float]) -> None:
    while True:
        try:
            await track.recv()
        except MediaStreamError:
            return
        arrivals.append(time.monotonic())


def longest_gap(arrivals: list[float], start: float, end: float) -> float:
    """The longest time without a frame in [start, end], its edges counting as frames."""
    times = [start, *(t for t in arrivals if start <= t <= end), end]
    return max(b - a for a, b in zip(times, times[1:], strict=False))


async def close_pair(tasks: Iterable[asyncio.Task[Any]], *peers: RTCPeerConnection) -> None:
    """A test's teardown: its watchers cancelled, both peers closed, the encoders' settings back to defaults."""
    for task in tasks:
        task.cancel()
    for peer in peers:
        await peer.close()
    configure_encoders(EncoderSettings())
