"""Clients for the audio/video sync tests: a WebRTC sender whose video flashes white every second while its audio
plays a tone burst at the same instants, watchers that note when flashes and bursts come back, and a pipeline
made slower on demand (as a slower engine would be)."""

import asyncio
import contextlib
import fractions
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import av
import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings

FPS = 15  # the slowed engine keeps up with it, so no flash frame is dropped on the way
RATE = 48000
AUDIO_FRAME = 960  # 20 ms
BURST_S = 0.1
DARK, BRIGHT = 40, 215
# In sync as broadcasters define it (EBU R37): sound at most 40 ms ahead of the picture or 60 ms behind it.
# Offsets are audio minus video, so ahead is negative. Measured on the RTSP pull of a 2-core AVX2 machine, the
# audio came 25-45 ms behind (medians), WebRTC 15-20 ms.
AUDIO_AHEAD_MS, AUDIO_BEHIND_MS = 40.0, 60.0


def in_sync(offset_ms: float) -> bool:
    return -AUDIO_AHEAD_MS <= offset_ms <= AUDIO_BEHIND_MS


@dataclass
class Clock:
    """The instant both tracks count from: flashes and tone bursts start at whole seconds after it."""

    start: float | None = None

    def origin(self) -> float:
        if self.start is None:
            self.start = time.monotonic() + 0.05
        return self.start


class FlashTrack(MediaStreamTrack):
    kind = "video"

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.sent = 0

    async def recv(self) -> av.VideoFrame:
        if self.readyState != "live":
            raise MediaStreamError
        due = self.clock.origin() + self.sent / FPS
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        level = BRIGHT if self.sent % FPS == 0 else DARK
        frame = av.VideoFrame.from_ndarray(np.full((240, 320, 3), level, np.uint8), format="bgr24")
        frame.pts = self.sent * 90000 // FPS
        frame.time_base = fractions.Fraction(1, 90000)
        self.sent += 1
        return frame


class ToneTrack(MediaStreamTrack):
    kind = "audio"

    def __init__(self, clock: Clock) -> None:
        super().__init__()
        self.clock = clock
        self.samples = 0

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        due = self.clock.origin() + self.samples / RATE
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        t = (self.samples + np.arange(AUDIO_FRAME)) / RATE
        burst = (t % 1.0) < BURST_S
        wave = np.where(burst, 0.5 * np.sin(2 * np.pi * 1000 * t), 0.0)
        frame = av.AudioFrame.from_ndarray((wave * 32767).astype(np.int16)[None, :], format="s16", layout="mono")
        frame.sample_rate = RATE
        frame.pts = self.samples
        frame.time_base = fractions.Fraction(1, RATE)
        self.samples += AUDIO_FRAME
        return frame


@dataclass
class Returned:
    flashes: list[float] = field(default_factory=list)
    tones: list[float] = field(default_factory=list)


async def watch_video(track: MediaStreamTrack, out: Returned) -> None:
    bright = False
    with contextlib.suppress(MediaStreamError):
        while True:
            frame = await track.recv()
            assert isinstance(frame, av.VideoFrame)
            now = time.monotonic()
            level = float(frame.to_ndarray(format="gray").mean())
            if level > 128 and not bright:
                out.flashes.append(now)
            bright = level > 128


async def watch_audio(track: MediaStreamTrack, out: Returned) -> None:
    loud = False
    with contextlib.suppress(MediaStreamError):
        while True:
            frame = await track.recv()
            assert isinstance(frame, av.AudioFrame)
            now = time.monotonic()
            samples = frame.to_ndarray().astype(np.float32).reshape(-1, len(frame.layout.channels))[:, 0]
            above = np.flatnonzero(np.abs(samples) > 3000)
            if len(above) and not loud:
                # The frame is handed over when it is due to play; the burst starts `above[0]` samples in.
                out.tones.append(now + (above[0] - len(samples)) / frame.sample_rate)
            loud = len(above) > 0


def offsets_ms(out: Returned) -> list[float]:
    """Audio minus video for each flash that has a tone burst within half a second (positive: audio late)."""
    tones = np.asarray(out.tones)
    result = []
    for flash in out.flashes:
        if len(tones):
            nearest = tones[np.argmin(np.abs(tones - flash))]
            if abs(nearest - flash) < 0.5:
                result.append((nearest - flash) * 1000.0)
    return result


def flash_and_tone_sender() -> RTCPeerConnection:
    """A peer connection that sends a `FlashTrack` and a `ToneTrack` counting from one clock."""
    clock = Clock()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver(FlashTrack(clock), direction="sendrecv")
    pc.addTransceiver(ToneTrack(clock), direction="sendrecv")
    return pc


async def open_session(http: httpx.AsyncClient, pc: RTCPeerConnection, identity: str) -> httpx.Response:
    """Offer `pc` to a new session swapping `identity` and apply the answer; the 201 response."""
    await pc.setLocalDescription(await pc.createOffer())
    response = await http.post(
        f"/v1/sessions?identity={identity}",
        content=pc.localDescription.sdp,
        headers={"Content-Type": "application/sdp"},
    )
    assert response.status_code == 201, response.text
    await pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
    return response


async def drain(track: MediaStreamTrack) -> None:
    """Receive and drop everything `track` brings until it ends."""
    with contextlib.suppress(MediaStreamError):
        while True:
            await track.recv()


class SlowedPipeline:
    """The real pipeline with a settable extra processing time, as a slower engine would take."""

    def __init__(self, pipeline: FramePipeline) -> None:
        self.extra_s = 0.0
        self._process = pipeline.process
        pipeline.process = self.process  # type: ignore[method-assign]

    def process(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.extra_s)
        return self._process(*args, **kwargs)


class SlowedFactory:
    """A pipeline factory whose pipeline is a `SlowedPipeline`; `extra(s)` is a phase that sets its extra time."""

    def __init__(self, factory: Callable[[PipelineSettings], FramePipeline]) -> None:
        self._factory = factory
        self.slowed: list[SlowedPipeline] = []

    def __call__(self, settings: PipelineSettings) -> FramePipeline:
        pipeline = self._factory(settings)
        self.slowed.append(SlowedPipeline(pipeline))
        return pipeline

    def extra(self, seconds: float) -> Callable[[], None]:
        return lambda: setattr(self.slowed[0], "extra_s", seconds)
