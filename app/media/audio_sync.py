"""A session's microphone back to its client, in sync with the swapped video.

Audio needs no processing, but the video it belongs to leaves the server later than it came in, by the
time the swap takes. So each audio frame is held for the video's measured processing latency (the median
of its recent frames, arrival to encoder) plus an extra offset the user sets (for a separate voice
changer), and then sent on. aiortc decodes what it receives and encodes what it sends, so on WebRTC the
audio is Opus decoded and encoded once; nothing else touches it.

The delay follows the video's latency as it changes: when it grows, sending pauses until the oldest held
frame is due; when it shrinks, the frames now overdue go out at once and the receiver's jitter buffer
absorbs them. Frames wait at most `MAX_DELAY_S`; older ones are dropped (counted).

The frames sent go to `outputs` too at that moment (the session's RTSP output), so every output of the
session gets the same delayed audio.
"""

from __future__ import annotations

import asyncio
import fractions
import time
from collections import deque
from collections.abc import Callable

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

MAX_DELAY_S = 2.0
MAX_OFFSET_MS = 1000


class DelayedAudioTrack(MediaStreamTrack):
    """Frames `push`ed in are sent `delay_s()` seconds after they arrived, with continuous timestamps."""

    kind = "audio"

    def __init__(self, delay_s: Callable[[], float]) -> None:
        super().__init__()
        self._delay_s = delay_s
        self._frames: deque[tuple[float, av.AudioFrame]] = deque()
        self._wake = asyncio.Event()
        self._next_pts: int | None = None
        self.enabled = True
        self.receiving = False  # the client sends audio (its offer has a microphone track)
        # Called with each frame as it is sent and the `time.monotonic()` instant it was due (a release
        # that the event loop made late keeps its place in time), on the event loop; each returns at once.
        self.outputs: list[Callable[[av.AudioFrame, float], None]] = []
        self.frames_in = 0
        self.frames_out = 0
        self.dropped = 0

    def push(self, frame: av.AudioFrame, arrived: float) -> None:
        """On the event loop: hold `frame` until it is due (or drop it while audio is off)."""
        if not self.enabled or self.readyState != "live":
            return
        self.frames_in += 1
        self._frames.append((arrived, frame))
        while self._frames and arrived - self._frames[0][0] > MAX_DELAY_S:
            self._frames.popleft()
            self.dropped += 1
        self._wake.set()

    def clear(self) -> None:
        self.dropped += len(self._frames)
        self._frames.clear()

    async def recv(self) -> av.AudioFrame:
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            if self._frames:
                arrived, frame = self._frames[0]
                due = arrived + min(MAX_DELAY_S, max(0.0, self._delay_s()))
                wait = due - time.monotonic()
                if wait <= 0:
                    self._frames.popleft()
                    for output in self.outputs:
                        output(frame, due)
                    return self._restamp(frame)
                await asyncio.sleep(min(wait, 0.02))  # the delay may change meanwhile
                continue
            self._wake.clear()
            await self._wake.wait()

    def _restamp(self, frame: av.AudioFrame) -> av.AudioFrame:
        """Continuous timestamps in samples, whatever was dropped or paused (the encoder expects them)."""
        if self._next_pts is None:
            self._next_pts = 0
        frame.pts = self._next_pts
        frame.time_base = fractions.Fraction(1, frame.sample_rate)
        self._next_pts += frame.samples
        self.frames_out += 1
        return frame

    def stop(self) -> None:
        super().stop()
        self.outputs.clear()
        self._frames.clear()
        self._wake.set()
