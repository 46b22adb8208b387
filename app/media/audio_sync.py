"""A session's microphone back to its client, in sync with the swapped video.

Audio needs no processing, but the video it belongs to leaves the server later than it came in, by the
time the swap takes. So each audio frame is held for the video's measured processing latency (the median
of its recent frames, arrival to encoder) plus an extra offset the user sets (for a separate voice
changer), and then sent on. aiortc decodes what it receives and encodes what it sends, so on WebRTC the
audio is Opus decoded and encoded once; nothing else touches it.

The delay follows the video's latency as it changes: when it grows, sending pauses until the oldest held
frame is due; when it shrinks, the frames now overdue go out at once and the receiver's jitter buffer
absorbs them. Frames wait at most `MAX_DELAY_S`; older ones are dropped (counted).

The frames released go to `outputs` too at that moment (the session's RTSP path, its WHEP viewers), so every
output of the session gets the same delayed audio. Frames are released by the track's own task when due, not when
the return's sender asks for the next: a sender held back (a slow client or link, its encoder waiting for a
thread) must not starve the session's other outputs of sound. What the return's sender has not taken waits for it,
`RETURN_MAX_FRAMES` at most (the oldest go first: it plays the newest sound, late by no more than that).
"""

from __future__ import annotations

import asyncio
import fractions
import logging
import time
from collections import deque
from collections.abc import Callable

import av
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

log = logging.getLogger(__name__)

MAX_DELAY_S = 2.0
MAX_OFFSET_MS = 1000
RETURN_MAX_FRAMES = 25  # 0.5 s of 20 ms frames


class DelayedAudioTrack(MediaStreamTrack):
    """Frames `push`ed in are sent `delay_s()` seconds after they arrived, with continuous timestamps."""

    kind = "audio"

    def __init__(self, delay_s: Callable[[], float]) -> None:
        super().__init__()
        self._delay_s = delay_s
        self._frames: deque[tuple[float, av.AudioFrame]] = deque()  # held until due
        self._wake = asyncio.Event()
        self._released: deque[av.AudioFrame] = deque()  # due, not yet taken by the return's sender
        self._has_released = asyncio.Event()
        self._releaser: asyncio.Task[None] | None = None
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
        if self._releaser is None:
            self._releaser = asyncio.get_running_loop().create_task(self._release())

    def clear(self) -> None:
        self.dropped += len(self._frames) + len(self._released)
        self._frames.clear()
        self._released.clear()

    async def recv(self) -> av.AudioFrame:
        """The return's next frame, once released."""
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            if self._released:
                return self._restamp(self._released.popleft())
            self._has_released.clear()
            await self._has_released.wait()

    async def _release(self) -> None:
        """Each held frame, when due, to the outputs and to the return's sender."""
        while self.readyState == "live":
            if self._frames:
                arrived, frame = self._frames[0]
                due = arrived + min(MAX_DELAY_S, max(0.0, self._delay_s()))
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(min(wait, 0.02))  # the delay may change meanwhile
                    continue
                self._frames.popleft()
                for output in list(self.outputs):
                    try:
                        output(frame, due)
                    except Exception:  # one output's failure must not silence the others or the return
                        self.outputs.remove(output)
                        log.exception("audio output %r failed and was dropped", output)
                self._released.append(frame)
                while len(self._released) > RETURN_MAX_FRAMES:
                    self._released.popleft()
                    self.dropped += 1
                self._has_released.set()
                continue
            self._wake.clear()
            await self._wake.wait()

    def _restamp(self, frame: av.AudioFrame) -> av.AudioFrame:
        """A copy with continuous timestamps in samples, whatever was dropped or paused (the encoder expects
        them). A copy: the outputs got the same frame, and one that holds it (WHEP viewers' sound waits for their
        picture) clears its timestamp for its resampler while the return's encoder, on another thread, reads it."""
        if self._next_pts is None:
            self._next_pts = 0
        out = av.AudioFrame.from_ndarray(frame.to_ndarray(), format=frame.format.name, layout=frame.layout.name)
        out.sample_rate = frame.sample_rate
        out.pts = self._next_pts
        out.time_base = fractions.Fraction(1, frame.sample_rate)
        self._next_pts += frame.samples
        self.frames_out += 1
        return out

    def stop(self) -> None:
        super().stop()
        self.outputs.clear()
        self._frames.clear()
        self._released.clear()
        self._wake.set()
        self._has_released.set()
        if self._releaser is not None:
            self._releaser.cancel()
