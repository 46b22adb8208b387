"""A WebRTC client that sends real frames with their frame id stamped in pixels (app.media.frame_ids) and reads
the ids back from what returns: round-trip latency per frame, order, and the returned images, for tests and the
server benchmark."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

import av
import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCRtpSender
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from app.media.frame_ids import ID_MODULO, luma, read_stamp, stamp
from app.media.whip_client import video_frames, whip_exchange
from app.pipeline.types import Image

__all__ = [
    "ID_MODULO",
    "Received",
    "RoundTrip",
    "RtcClient",
    "StampedTrack",
    "luma",
    "read_stamp",
    "stamp",
    "video_frames",
]

VIDEO_TIME_BASE = Fraction(1, 90000)


class StampedTrack(MediaStreamTrack):
    """Sends `frames` in a loop at `fps`, each stamped with its running index."""

    kind = "video"

    def __init__(self, frames: Sequence[Image], fps: int = 30, on_sent: Callable[[int, float], None] | None = None):
        super().__init__()
        if not frames:
            raise ValueError("need at least one frame")
        self.frames = list(frames)
        self.fps = fps
        self.sent = 0
        self._on_sent = on_sent
        self._start: float | None = None

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        now = time.monotonic()
        if self._start is None:
            self._start = now
        due = self._start + self.sent / self.fps
        if due > now:
            await asyncio.sleep(due - now)
        index = self.sent
        image = self.frames[index % len(self.frames)].copy()
        stamp(image, index)
        frame = av.VideoFrame.from_ndarray(image, format="bgr24")
        frame.pts = round(index * 90000 / self.fps)
        frame.time_base = VIDEO_TIME_BASE
        self.sent += 1
        if self._on_sent is not None:
            self._on_sent(index, time.monotonic())
        return frame


@dataclass
class Received:
    frame_id: int
    at: float
    image: Image | None


@dataclass
class RoundTrip:
    """What one client sent and got back."""

    sent_at: dict[int, float] = field(default_factory=dict)
    received: list[Received] = field(default_factory=list)
    unreadable: int = 0

    def latencies_ms(self, skip_first_s: float = 0.0) -> list[float]:
        if not self.sent_at:
            return []
        start = min(self.sent_at.values()) + skip_first_s
        out = []
        for r in self.received:
            sent = self.sent_at.get(r.frame_id)
            if sent is not None and sent >= start:
                out.append((r.at - sent) * 1000.0)
        return out

    def ids(self) -> list[int]:
        return [r.frame_id for r in self.received]


class RtcClient:
    """One WebRTC connection to a server that answers WHIP-style (`POST` offer → `201` answer + Location)."""

    def __init__(
        self,
        frames: Sequence[Image],
        *,
        fps: int = 30,
        codec: str | None = None,
        keep_images: bool = False,
    ) -> None:
        self.result = RoundTrip()
        self.track = StampedTrack(frames, fps, self._sent)
        self.codec = codec
        self.keep_images = keep_images
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.location: str | None = None
        self.answer: str | None = None
        self._reader: asyncio.Task[None] | None = None
        self._remote: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()
        self.new_frame = asyncio.Event()

    def _sent(self, frame_id: int, at: float) -> None:
        self.result.sent_at[frame_id % ID_MODULO] = at

    def add_video(self) -> None:
        """The connection's video: sent and received, in the chosen codec (a receive-only client overrides it)."""
        transceiver = self.pc.addTransceiver(self.track, direction="sendrecv")
        if self.codec is not None:
            mime = f"video/{self.codec}".lower()
            caps = RTCRtpSender.getCapabilities("video").codecs
            transceiver.setCodecPreferences(
                [c for c in caps if c.mimeType.lower() == mime] + [c for c in caps if c.mimeType.lower() == "video/rtx"]
            )

    async def connect(self, http: httpx.AsyncClient, url: str) -> httpx.Response:
        """Offer (after ICE gathering), post it to `url`, apply the answer. Returns the HTTP response; raises
        `httpx.HTTPStatusError` when the server refuses."""
        self.add_video()

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "video" and not self._remote.done():
                self._remote.set_result(track)

        response = await whip_exchange(
            self.pc, http, url, offer_to_post=self.offer_to_post, answer_to_apply=self.answer_to_apply
        )
        self.location = response.headers.get("location")
        self.answer = response.text
        remote = await self._remote
        self._reader = asyncio.ensure_future(self._read(remote))
        return response

    def offer_to_post(self, sdp: str) -> str:
        """The offer as posted to the server: as created (a subclass may route it elsewhere)."""
        return sdp

    def answer_to_apply(self, sdp: str) -> str:
        """The server's answer as applied: as received (a subclass may route it elsewhere)."""
        return sdp

    async def _read(self, track: MediaStreamTrack) -> None:
        async for at, frame in video_frames(track):
            image = np.asarray(frame.to_ndarray(format="bgr24"), np.uint8) if self.keep_images else None
            frame_id = read_stamp(image if image is not None else luma(frame))
            if frame_id is None:
                self.result.unreadable += 1
                continue
            self.result.received.append(Received(frame_id, at, image))
            self.new_frame.set()

    async def wait_frames(self, count: int, within_s: float) -> bool:
        """Wait until `count` stamped frames came back; False if they did not within `within_s` seconds."""
        return await self._wait_until(lambda: len(self.result.received) >= count, within_s)

    async def wait_sent_after(self, moment: float, within_s: float) -> bool:
        """Wait until a frame sent at or after `moment` (monotonic clock) came back; False on timeout."""
        return await self._wait_until(lambda: self._got_sent_after(moment), within_s)

    async def _wait_until(self, done: Callable[[], bool], within_s: float) -> bool:
        """Re-check `done` whenever a frame comes back (and at least every 0.5 s) until `within_s` runs out."""
        deadline = time.monotonic() + within_s
        while not done():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self.new_frame.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.new_frame.wait(), min(left, 0.5))
        return True

    def _got_sent_after(self, moment: float) -> bool:
        received = self.result.received
        return bool(received) and self.result.sent_at.get(received[-1].frame_id, 0.0) >= moment

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self.track.stop()
        await self.pc.close()
