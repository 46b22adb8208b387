"""The load of `swapcast bench-soak`: one join/leave cycle of every kind of client the server has, against one
server, with what each returned (frame arrivals and their latency) kept for the benchmark's windows.

A cycle opens `sessions` WebRTC sessions (the first publishes into the run's channel), one RTSP-ingest stream
from the run's own stamped RTSP source, a WHEP viewer of the last session and one of the channel, and PyAV
RTSP pullers of the stream's output and of the channel's; while they run it switches the sessions' identity
back and forth (PATCH) and uploads and deletes an identity; then every client leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any

import httpx
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from app.bench.rtc_client import RtcClient, luma, read_stamp, video_frames
from app.bench.rtsp_ingest_cell import OutputReader, StampedSource, output_url
from app.pipeline.types import Image

FORM_HEADERS = {"X-Swapcast": "1"}  # a form POST without it is refused as possibly cross-site


@dataclass
class Arrival:
    kind: str  # session, whep, rtsp_stream, rtsp_channel
    at: float  # monotonic
    latency_ms: float | None  # None where the frame's stamp could not be matched to its sending


@dataclass
class Presence:
    kind: str
    joined: float
    left: float = 0.0


@dataclass
class Record:
    """Everything the load saw over the run: arrivals, who was connected when, and what went wrong."""

    arrivals: list[Arrival] = field(default_factory=list)
    presence: list[Presence] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    operations: dict[str, int] = field(default_factory=dict)

    def count(self, what: str) -> None:
        self.operations[what] = self.operations.get(what, 0) + 1

    def error(self, where: str, exc: BaseException | str) -> None:
        text = exc if isinstance(exc, str) else f"{type(exc).__name__}: {exc}"
        self.errors.append(f"{where}: {text}"[:300])


class WhepViewer:
    """A receive-only aiortc peer that watches an output over WHEP and reads the stamps of what it gets."""

    def __init__(self, sent_at: dict[int, float] | None) -> None:
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        self.sent_at = sent_at
        self.location: str | None = None
        self.arrivals: list[tuple[float, float | None]] = []
        self._reader: asyncio.Task[None] | None = None

    async def connect(self, http: httpx.AsyncClient, url: str) -> None:
        self.pc.addTransceiver("video", direction="recvonly")
        remote: asyncio.Future[MediaStreamTrack] = asyncio.get_running_loop().create_future()

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "video" and not remote.done():
                remote.set_result(track)

        await self.pc.setLocalDescription(await self.pc.createOffer())
        response = await http.post(
            url, content=self.pc.localDescription.sdp, headers={"Content-Type": "application/sdp"}
        )
        response.raise_for_status()
        self.location = response.headers.get("location")
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        self._reader = asyncio.ensure_future(self._read(await remote))

    async def _read(self, track: MediaStreamTrack) -> None:
        async for at, frame in video_frames(track):
            value = read_stamp(luma(frame))
            sent = self.sent_at.get(value) if (self.sent_at is not None and value is not None) else None
            self.arrivals.append((at, (at - sent) * 1000.0 if sent is not None else None))

    async def close(self, http: httpx.AsyncClient) -> None:
        if self.location:
            with contextlib.suppress(httpx.HTTPError):
                await http.delete(self.location)
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.pc.close()


@dataclass
class Run:
    """What stays up for the whole run: the server's address, the identities, the channel and the source."""

    base_url: str
    identities: tuple[str, str]
    channel: str
    photo: bytes
    frames: list[Image]
    fps: int
    source: StampedSource
    record: Record = field(default_factory=Record)


@dataclass
class Cycle:
    sessions: list[RtcClient] = field(default_factory=list)
    viewers: list[tuple[str, WhepViewer]] = field(default_factory=list)
    readers: list[tuple[str, OutputReader]] = field(default_factory=list)
    stream: str | None = None
    presence: list[Presence] = field(default_factory=list)

    def joined(self, kind: str) -> None:
        self.presence.append(Presence(kind, time.monotonic()))


async def create_channel(http: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    response = await http.post("/v1/channels", json=body)
    response.raise_for_status()
    return dict(response.json())


async def upload(http: httpx.AsyncClient, photo: bytes) -> str:
    response = await http.post(
        "/v1/identities", files={"image": ("face.png", photo)}, data={"consent": "self"}, headers=FORM_HEADERS
    )
    response.raise_for_status()
    return str(response.json()["id"])


async def _connect(record: Record, cycle: Cycle, kind: str, connecting: Awaitable[object]) -> None:
    """A client of `kind` joins the cycle once `connecting` is done; what went wrong is recorded, not raised."""
    try:
        await connecting
        cycle.joined(kind)
        record.count(f"{kind}_join")
    except (httpx.HTTPError, OSError, ValueError) as exc:
        record.error(kind, exc)


async def _join(run: Run, cycle: Cycle, http: httpx.AsyncClient, sessions: int) -> None:
    record = run.record
    for i in range(sessions):
        client = RtcClient(run.frames, fps=run.fps, codec="H264")
        cycle.sessions.append(client)
        path = f"/v1/sessions?identity={run.identities[0]}" + (f"&channel={run.channel}" if i == 0 else "")
        await _connect(record, cycle, "session", client.connect(http, path))
    try:
        created = await http.post("/v1/streams", json={"source_url": run.source.url, "identity": run.identities[0]})
        created.raise_for_status()
        cycle.stream = f"/v1/streams/{created.json()['id']}"
        record.count("stream_join")
        url = await output_url(http, cycle.stream)
        cycle.readers.append(("rtsp_stream", OutputReader(url, run.source.sent_at)))
        cycle.joined("rtsp_stream")
    except (httpx.HTTPError, OSError, ValueError, RuntimeError) as exc:
        record.error("stream", exc)
    watched = [(f"/v1/channels/{run.channel}/whep", cycle.sessions[0])] if cycle.sessions else []
    if len(cycle.sessions) > 1 and cycle.sessions[-1].location:
        watched.append((f"{cycle.sessions[-1].location}/whep", cycle.sessions[-1]))
    for url, client in watched:
        viewer = WhepViewer(client.result.sent_at)
        cycle.viewers.append(("whep", viewer))
        await _connect(record, cycle, "whep", viewer.connect(http, url))
    try:
        channel = (await http.get(f"/v1/channels/{run.channel}")).json()
        if channel.get("rtsp_url") and cycle.sessions:
            sent_at = cycle.sessions[0].result.sent_at
            cycle.readers.append(("rtsp_channel", OutputReader(channel["rtsp_url"], sent_at)))
            cycle.joined("rtsp_channel")
    except (httpx.HTTPError, ValueError) as exc:
        record.error("channel puller", exc)


async def _meanwhile(run: Run, cycle: Cycle, http: httpx.AsyncClient, hold_s: float, patch_every_s: float) -> None:
    """Identity switches every `patch_every_s`, and one identity uploaded and deleted, while the clients run."""
    record = run.record
    end = time.monotonic() + hold_s
    flip = 1
    uploaded = False
    while time.monotonic() < end:
        await asyncio.sleep(min(patch_every_s, max(0.0, end - time.monotonic())))
        targets = [c.location for c in cycle.sessions if c.location] + ([cycle.stream] if cycle.stream else [])
        for location in targets:
            try:
                (await http.patch(location, json={"identity": run.identities[flip]})).raise_for_status()
                record.count("identity_patch")
            except httpx.HTTPError as exc:
                record.error("patch", exc)
        flip = 1 - flip
        if not uploaded:
            uploaded = True
            try:
                made = await upload(http, run.photo)
                record.count("identity_upload")
                (await http.delete(f"/v1/identities/{made}")).raise_for_status()
                record.count("identity_delete")
            except httpx.HTTPError as exc:
                record.error("identity upload/delete", exc)


async def _leave(run: Run, cycle: Cycle, http: httpx.AsyncClient) -> None:
    now = time.monotonic()
    for presence in cycle.presence:
        presence.left = now
    run.record.presence.extend(cycle.presence)
    for kind, viewer in cycle.viewers:
        await viewer.close(http)
        run.record.arrivals.extend(Arrival(kind, at, latency) for at, latency in viewer.arrivals)
    for client in cycle.sessions:
        if client.location:
            with contextlib.suppress(httpx.HTTPError):
                await http.delete(client.location)
        await client.close()
        sent = client.result.sent_at
        run.record.arrivals.extend(
            Arrival("session", r.at, (r.at - sent[r.frame_id]) * 1000.0 if r.frame_id in sent else None)
            for r in client.result.received
        )
    for kind, reader in cycle.readers:
        await asyncio.to_thread(reader.close)
        if reader.error:
            run.record.error(kind, reader.error)
        run.record.arrivals.extend(Arrival(kind, at, (at - pushed) * 1000.0) for _, pushed, at in reader.received)
    if cycle.stream:
        with contextlib.suppress(httpx.HTTPError):
            await http.delete(cycle.stream)


async def cycle(run: Run, sessions: int, hold_s: float, patch_every_s: float) -> None:
    """One join, hold and leave of every client."""
    current = Cycle()
    async with httpx.AsyncClient(base_url=run.base_url, timeout=30) as http:
        try:
            await _join(run, current, http, sessions)
            await _meanwhile(run, current, http, hold_s, patch_every_s)
        finally:
            await _leave(run, current, http)
