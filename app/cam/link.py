"""One session with the server: the camera goes out on a peer connection and the swapped picture comes back on
the same one (the session's return, its own adaptive encoder). A session that ends, fails or goes silent is
reported as lost; the caller opens a new one (aiortc cannot restart ICE, as the page also knows)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from fractions import Fraction

import av
import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from app.cam.camera import Camera
from app.cam.sink_worker import SinkWorker
from app.cam.stats import CamStats
from app.errors import server_reason
from app.media.frame_ids import stamp
from app.media.whip_client import video_frames, whip_exchange
from app.pipeline.types import Image

TIME_BASE = Fraction(1, 90000)
SILENCE_S = 10.0  # live, but no frame back for this long: the link is lost
FIRST_FRAME_S = 30.0  # answered, but no frame back this long after: lost


class Refused(Exception):
    """The server answered the offer with an error status."""

    def __init__(self, status: int, detail: str, retry_after_s: float | None) -> None:
        super().__init__(f"{detail} ({status})")
        self.status = status
        self.detail = detail
        self.retry_after_s = retry_after_s

    @property
    def permanent(self) -> bool:
        """4xx answers other than 408, 425 and 429 will not change by asking again."""
        return 400 <= self.status < 500 and self.status not in (408, 425, 429)


def refusal(response: httpx.Response) -> Refused:
    retry_after = response.headers.get("Retry-After", "")
    seconds = float(retry_after) if retry_after.strip().isdigit() else None
    return Refused(response.status_code, server_reason(response)[:300], seconds)


class CameraTrack(MediaStreamTrack):
    """The camera's newest frames, numbered across sessions; stamped with their number when measuring."""

    kind = "video"

    def __init__(self, camera: Camera, stats: CamStats, *, measure: bool) -> None:
        super().__init__()
        self.camera = camera
        self.stats = stats
        self.measure = measure
        self._origin: float | None = None

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        captured = await self.camera.next_frame()
        frame = captured.frame
        if self.measure:
            image: Image = np.asarray(frame.to_ndarray(format="bgr24"), np.uint8)
            stamp(image, self.stats.sent)
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
        self._origin = captured.read_at if self._origin is None else self._origin
        frame.pts = round((captured.read_at - self._origin) * 90000)
        frame.time_base = TIME_BASE
        self.stats.note_sent(self.stats.sent, captured.read_at)
        return frame


class Link:
    def __init__(self, camera: Camera, worker: SinkWorker, stats: CamStats, *, measure: bool) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.track = CameraTrack(camera, stats, measure=measure)
        self.worker = worker
        self.stats = stats
        self.location: str | None = None
        self.opened_at = time.monotonic()
        self.last_frame_at: float | None = None
        self.lost = asyncio.Event()
        self.reason = "the connection ended"
        self._reader: asyncio.Task[None] | None = None

    async def open(self, http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
        """Post the offer; raises Refused on an error status, httpx.HTTPError when the server is unreachable."""
        self.pc.addTransceiver(self.track, direction="sendrecv")

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "video" and self._reader is None:
                self._reader = asyncio.ensure_future(self._read(track))

        @self.pc.on("connectionstatechange")
        def on_state() -> None:
            if self.pc.connectionState in ("failed", "closed"):
                self._lose(f"the connection {self.pc.connectionState}")

        try:
            response = await whip_exchange(self.pc, http, url, headers=headers)
        except httpx.HTTPStatusError as exc:
            raise refusal(exc.response) from None
        self.location = response.headers.get("location")
        self.opened_at = time.monotonic()
        self.stats.sessions += 1

    async def _read(self, track: MediaStreamTrack) -> None:
        async for at, frame in video_frames(track):
            self.last_frame_at = at
            self.stats.received += 1
            self.worker.put(frame)
        self._lose("the server ended the session")

    def _lose(self, reason: str) -> None:
        if not self.lost.is_set():
            self.reason = reason
            self.lost.set()

    async def wait_lost(self, until: float | None) -> str | None:
        """The reason the link was lost, or None when `until` (monotonic clock) came first."""
        while not self.lost.is_set():
            now = time.monotonic()
            if until is not None and now >= until:
                return None
            if self.last_frame_at is None and now - self.opened_at > FIRST_FRAME_S:
                self._lose(f"no picture came back within {FIRST_FRAME_S:.0f} s")
            elif self.last_frame_at is not None and now - self.last_frame_at > SILENCE_S:
                self._lose(f"no picture for {SILENCE_S:.0f} s")
            else:
                step = 0.5 if until is None else max(0.0, min(0.5, until - now))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.lost.wait(), step)
        return self.reason

    @property
    def live_for(self) -> float:
        return time.monotonic() - self.opened_at if self.last_frame_at is not None else 0.0

    async def close(self, http: httpx.AsyncClient, headers: dict[str, str]) -> None:
        """End the session on the server (it would end by itself after its media timeout) and the peer."""
        if self.location is not None:
            with contextlib.suppress(httpx.HTTPError):
                await http.delete(self.location, headers=headers, timeout=5)
            self.location = None
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        self.track.stop()
        await self.pc.close()
