"""Clients of a channel as a streamer's tools are: publishers whose frames say who sent them (a coloured band
along the bottom, kept by the swap, which changes only the face), and consumers that record, per decoded
frame, when it came and what it showed (a publisher's band, or the slate)."""

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import av
import numpy as np

from app.media.rtsp_in import LIVE_OPTIONS
from app.pipeline.types import Image
from tests.server.whep_client import WhepReceiver

BAND = 24  # rows at the bottom of each publisher's frames
COLOURS = {"red": (0, 0, 255), "blue": (255, 0, 0), "green": (0, 255, 0)}  # BGR


def banded(frames: Sequence[Image], colour: str) -> list[Image]:
    """`frames` with the publisher's band painted along the bottom."""
    out = []
    for frame in frames:
        image = frame.copy()
        image[-BAND:] = COLOURS[colour]
        out.append(image)
    return out


def what_it_shows(image: Image) -> str:
    """The colour of the band, or "other" (the slate, or a frame still being decoded into shape)."""
    band = image[-BAND + 4 : -4, 8:-8].reshape(-1, 3).mean(axis=0)
    for name, bgr in COLOURS.items():
        if float(np.abs(band - np.asarray(bgr, np.float64)).max()) < 60:
            return name
    return "other"


@dataclass
class Seen:
    """What a consumer decoded: (monotonic time, what the frame showed)."""

    frames: list[tuple[float, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def first(self, shows: str, after: float = 0.0) -> float | None:
        return next((t for t, s in self.frames if s == shows and t >= after), None)

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time without a decoded frame between `start` and `end`."""
        times = [start, *(t for t, _ in self.frames if start <= t <= end), end]
        return max(b - a for a, b in zip(times, times[1:], strict=False))

    def per_second(self, start: float, end: float) -> list[int]:
        bins = [0] * max(1, int(end - start))
        for t, _ in self.frames:
            if start <= t < start + len(bins):
                bins[int(t - start)] += 1
        return bins


class RtspConsumer:
    """Reads an RTSP URL on its own thread (as OBS's media source does, through FFmpeg) until stopped."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.seen = Seen()
        self.opened = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            with av.open(self.url, options=LIVE_OPTIONS, timeout=(30, 10)) as container:
                self.opened.set()
                for frame in container.decode(video=0):
                    image = np.asarray(frame.to_ndarray(format="bgr24"), np.uint8)
                    self.seen.frames.append((time.monotonic(), what_it_shows(image)))
                    if self._stop.is_set():
                        return
        except Exception as exc:  # recorded: a consumer that fails mid-way is what the tests look for
            self.seen.errors.append(repr(exc))
        finally:
            self.opened.set()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)


@dataclass
class WhepConsumer(WhepReceiver):
    """A WHEP viewer that records what every decoded frame shows."""

    seen: Seen = field(default_factory=Seen)

    def on_frame(self, frame: av.VideoFrame) -> None:
        image = np.asarray(frame.to_ndarray(format="bgr24"), np.uint8)
        self.seen.frames.append((time.monotonic(), what_it_shows(image)))
