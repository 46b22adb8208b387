"""Audio in sync with the swapped video on the WebRTC return: a real aiortc client sends video with a white
flash every second and audio with a 1 kHz tone burst at the same instants; what comes back must keep them
together (the server delays the audio by the video's processing latency)."""

import asyncio
import contextlib
import fractions
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import av
import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import RunningServer, server_settings, start_server, upload

FPS = 15  # the slowed engine keeps up with it, so no flash frame is dropped on the way
RATE = 48000
AUDIO_FRAME = 960  # 20 ms
BURST_S = 0.1
DARK, BRIGHT = 40, 215


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


async def stream(
    server: RunningServer, identity: str, phases: list[Callable[[], None]], seconds: float
) -> tuple[list[list[float]], list[float], dict[str, Any]]:
    """Stream `seconds` per phase (each phase starts by calling its function); the offsets of each phase and
    the audio delay the server applied at its end."""
    clock = Clock()
    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver(FlashTrack(clock), direction="sendrecv")
    pc.addTransceiver(ToneTrack(clock), direction="sendrecv")
    out = Returned()
    tasks: list[asyncio.Task[None]] = []

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        watch = watch_video if track.kind == "video" else watch_audio
        tasks.append(asyncio.ensure_future(watch(track, out)))

    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        response = await http.post(
            f"/v1/sessions?identity={identity}",
            content=pc.localDescription.sdp,
            headers={"Content-Type": "application/sdp"},
        )
        assert response.status_code == 201, response.text
        assert "m=audio" in response.text
        location = response.headers["location"]
        await pc.setRemoteDescription(RTCSessionDescription(sdp=response.text, type="answer"))
        per_phase = []
        delays = []
        for phase in phases:
            phase()
            seen = len(out.flashes)
            await asyncio.sleep(seconds)
            per_phase.append(offsets_ms(Returned(out.flashes[seen:], out.tones)))
            delays.append(float((await http.get(f"{location}/audio")).json()["delay_ms"]))
        audio = (await http.get(f"{location}/audio")).json()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pc.close()
        await http.delete(location)
    return per_phase, delays, audio


class SlowedPipeline:
    """The real pipeline with a settable extra processing time, as a slower engine would take."""

    def __init__(self, pipeline: FramePipeline) -> None:
        self.extra_s = 0.0
        self._process = pipeline.process
        pipeline.process = self.process  # type: ignore[method-assign]

    def process(self, *args: Any, **kwargs: Any) -> Any:
        time.sleep(self.extra_s)
        return self._process(*args, **kwargs)


@pytest.mark.slow
def test_audio_comes_back_in_sync_with_the_video_as_the_engine_slows_down(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    slowed: list[SlowedPipeline] = []

    def factory(settings: PipelineSettings) -> FramePipeline:
        pipeline = pipeline_factory(settings)
        slowed.append(SlowedPipeline(pipeline))
        return pipeline

    def extra(seconds: float) -> Callable[[], None]:
        return lambda: setattr(slowed[0], "extra_s", seconds)

    with start_server(server_settings(tmp_path / "identities"), factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        phases, delays, audio = asyncio.run(stream(server, identity, [extra(0.0), extra(0.04)], 9.0))
    print(
        f"A/V offsets on the WebRTC return, ms (audio minus video), engine as is then 40 ms slower: {phases}; {audio}"
    )
    assert audio["frames_out"] > 100 and audio["dropped"] <= 5, audio
    # The slower engine's latency is what the audio waits for: the delay grows with the 40 ms slowdown
    # (measured against the first phase, so the machine's own speed does not matter).
    assert delays[1] - delays[0] >= 25.0, (delays, audio)
    for offsets in phases:
        steady = offsets[1:]  # the delay follows the video's median latency over its last 30 frames
        assert len(steady) >= 3, phases
        assert abs(float(np.median(steady))) <= 40.0, phases
