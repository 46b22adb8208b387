"""A/V offset of a stream, measured the way a player sees it: a source flashes the picture and starts a tone
burst at the same instants (every whole second); a client decodes both and compares, by presentation
timestamp, when each flash and each burst begin.

Used by the tests of the RTSP output (PyAV pulls, as OBS's media source would) and of the WebRTC return.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from fractions import Fraction

import av
import numpy as np
import numpy.typing as npt

RATE = 48000
BURST_S = 0.1
TONE_HZ = 1000.0
DARK, BRIGHT = 40, 215
# Above this (of int16 full scale) a sample belongs to a burst; the bursts are at half scale.
LOUD = 3000
# Reading options of a low-delay FFmpeg client (as OBS's media source with "network buffering" off).
PULL_OPTIONS = {"rtsp_transport": "tcp", "fflags": "nobuffer", "flags": "low_delay"}


def flash_level(seconds: float, fps: int) -> int:
    """The picture's level at `seconds` from the start: bright for the one frame at each whole second."""
    return BRIGHT if round(seconds * fps) % fps == 0 else DARK


def tone_samples(first_sample: int, count: int) -> npt.NDArray[np.int16]:
    """Mono int16 samples `first_sample`.. at `RATE`: a half-scale tone for `BURST_S` after each whole second."""
    t = (first_sample + np.arange(count)) / RATE
    burst = (t % 1.0) < BURST_S
    wave = np.where(burst, 0.5 * np.sin(2 * np.pi * TONE_HZ * t), 0.0)
    return (wave * 32767).astype(np.int16)


def tone_frame(first_sample: int, count: int) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(tone_samples(first_sample, count)[None, :], format="s16", layout="mono")
    frame.sample_rate = RATE
    frame.pts = first_sample
    frame.time_base = Fraction(1, RATE)
    return frame


@dataclass
class Onsets:
    """When flashes and tone bursts begin, in seconds on one clock (a stream's presentation time)."""

    flashes: list[float] = field(default_factory=list)
    tones: list[float] = field(default_factory=list)
    _bright: bool = False
    _loud: bool = False

    def video(self, t: float, frame: av.VideoFrame) -> None:
        level = float(np.asarray(frame.to_ndarray(format="gray")).mean())
        bright = level > (DARK + BRIGHT) / 2
        if bright and not self._bright:
            self.flashes.append(t)
        self._bright = bright

    def audio(self, t: float, frame: av.AudioFrame) -> None:
        """`t`: when the frame's first sample plays."""
        samples = np.asarray(frame.to_ndarray())
        channels = len(frame.layout.channels)
        first = samples[0] if frame.format.is_planar else samples.reshape(-1, channels)[:, 0]
        scale = 32767.0 if first.dtype.kind == "f" else 1.0
        above = np.flatnonzero(np.abs(np.asarray(first, np.float64)) * scale > LOUD)
        if len(above) and not self._loud:
            self.tones.append(t + float(above[0]) / frame.sample_rate)
        self._loud = len(above) > 0

    def offsets_ms(self, since: float = float("-inf")) -> list[float]:
        """Audio minus video for each flash after `since` with a burst within half a second (positive: audio
        late)."""
        tones = np.asarray(self.tones)
        result = []
        for flash in self.flashes:
            if flash < since or not len(tones):
                continue
            nearest = float(tones[np.argmin(np.abs(tones - flash))])
            if abs(nearest - flash) < 0.5:
                result.append((nearest - flash) * 1000.0)
        return result


def pull_onsets(url: str, seconds: float, onsets: Onsets | None = None) -> Onsets:
    """Decode video and audio of `url` for `seconds` (wall clock) and note onsets by presentation time."""
    onsets = onsets if onsets is not None else Onsets()
    with av.open(url, options=PULL_OPTIONS, timeout=(15.0, 10.0)) as container:
        if not container.streams.video or not container.streams.audio:
            kinds = [s.type for s in container.streams]
            raise ValueError(f"{url} has streams {kinds}; expected video and audio")
        video, audio = container.streams.video[0], container.streams.audio[0]
        end = time.monotonic() + seconds
        for packet in container.demux(video, audio):
            if time.monotonic() > end:
                break
            for frame in packet.decode():
                if isinstance(frame, av.VideoFrame) and frame.pts is not None and frame.time_base is not None:
                    onsets.video(float(frame.pts * frame.time_base), frame)
                elif isinstance(frame, av.AudioFrame) and frame.pts is not None and frame.time_base is not None:
                    onsets.audio(float(frame.pts * frame.time_base), frame)
    return onsets
