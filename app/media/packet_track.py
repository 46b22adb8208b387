"""A WebRTC track of packets encoded once for many viewers: aiortc's sender takes an `av.Packet` from `recv` and
packetizes it without encoding again. Shared by WHEP's video (`app.egress.whep`) and audio
(`app.egress.whep_audio`) tracks, which differ only in what they queue and drop (`deliver`)."""

from __future__ import annotations

import asyncio
import contextlib

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack


class PacketTrack(MediaStreamTrack):
    """One viewer's packets, in order; subclasses fill `_queue` on the event loop."""

    def __init__(self) -> None:
        super().__init__()
        self._queue: asyncio.Queue[av.Packet] = asyncio.Queue()
        self.packets_sent = 0
        self.packets_dropped = 0

    async def recv(self) -> av.Packet:  # aiortc senders accept packets as well as frames
        if self.readyState != "live":
            raise MediaStreamError
        packet = await self._queue.get()
        if self.readyState != "live":
            raise MediaStreamError
        self.packets_sent += 1
        return packet

    def stop(self) -> None:
        super().stop()
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(av.Packet(b""))  # wakes a pending recv, which then sees the track ended
