"""`ChannelFeed`: one channel's picture, whoever publishes into it, at a steady rate.

A publisher (a session's or a stream's live core) hands its processed frames to `publish`; they are fitted to
the channel's size (letterboxed, so a 4:3 camera keeps its shape in a 16:9 channel) and passed at once to every
output listener (the channel's RTSP path, its WHEP viewers). While no publisher frame comes for `GAP_S`, the
feed's own thread fills in at the channel's rate: the last published frame, frozen, until `hold_s` after it,
then the slate. Never the unswapped camera: only processed frames reach `publish`. Consumers therefore stay
connected across a publisher's drop and return, with timestamps that keep running (their encoders stamp what
arrives), and the first frame of each new publisher asks the encoders for a keyframe.

Only the current publisher is heard: a newer one takes over (`attach`), and late frames of the older one are
ignored."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import av
import cv2
import numpy as np

from app.live.adapter import AudioListener
from app.live.core import OutputListener
from app.live.frame import OutputFrame, letterbox
from app.pipeline.types import Image

log = logging.getLogger(__name__)

# No publisher frame for this long: the feed fills in (a publisher that makes 5 frames a second is not
# interrupted; a stalled one is covered before consumers' players notice).
GAP_S = 0.25
PROBE_GAP = 1.2


@dataclass
class ChannelCounters:
    publisher_changes: int = 0
    frames_published: int = 0
    frames_superseded: int = 0  # published frames replaced by a newer one before the feed's thread took them
    frames_held: int = 0  # the last frame sent again while nobody published
    frames_slate: int = 0
    seconds_held: float = 0.0
    seconds_on_slate: float = 0.0
    errors: int = 0  # frames an output listener raised on
    last_publisher_frame: float | None = None  # monotonic
    publisher_since: float | None = None
    history: list[dict[str, Any]] = field(default_factory=list)  # the last publishers, newest last


HISTORY = 8


def default_slate(width: int, height: int) -> Image:
    """A plain dark card saying "Be right back" (what a channel shows while nobody publishes into it)."""
    slate = np.full((height, width, 3), (40, 32, 28), np.uint8)
    text = "Be right back"
    scale = max(0.5, width / 640.0)
    thickness = max(1, round(2 * scale))
    (tw, th), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, thickness)
    origin = ((width - tw) // 2, (height + th) // 2)
    cv2.putText(slate, text, origin, cv2.FONT_HERSHEY_SIMPLEX, scale, (235, 235, 235), thickness, cv2.LINE_AA)
    return slate


class ChannelFeed:
    def __init__(
        self,
        name: str,
        width: int,
        height: int,
        fps: int,
        *,
        hold_s: float,
        slate: Image | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.width, self.height, self.fps = width, height, fps
        self.hold_s = hold_s
        # One frame for the whole time on slate: its I420 form is converted once.
        self.slate = OutputFrame(letterbox(slate, width, height) if slate is not None else default_slate(width, height))
        # Called with every frame the channel sends (published or filled in); each must return at once.
        self.output_listeners: list[OutputListener] = []
        self.audio_listeners: list[AudioListener] = []
        # Called when a new publisher's first frame is about to go out: encoders start it on a keyframe.
        self.keyframe_listeners: list[Callable[[], None]] = []
        self.counters = ChannelCounters()
        self._clock = clock
        self._lock = threading.Condition()
        self._publisher: str | None = None
        self._keyframe_due = False
        self._pending: OutputFrame | None = None  # the newest published frame, not yet sent
        self._probe_left = 0  # frames still sent at the full rate, gaps of one interval filled (`probe`)
        self._last: OutputFrame | None = None  # the last one sent, at the channel's size
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"channel-{name}", daemon=True)
        self._thread.start()

    @property
    def publisher(self) -> str | None:
        return self._publisher

    def attach(self, publisher: str) -> None:
        """`publisher` (an output key such as `session/ID`) publishes from now on, in place of any other."""
        now = self._clock()
        with self._lock:
            self._publisher = publisher
            self._keyframe_due = True
            self._pending = None
            c = self.counters
            c.publisher_changes += 1
            c.publisher_since = now
            c.history = [*c.history, {"publisher": publisher, "since": round(time.time(), 3)}][-HISTORY:]

    def detach(self, publisher: str) -> None:
        """`publisher` stopped; no-op when another has taken over meanwhile."""
        with self._lock:
            if self._publisher == publisher:
                self._publisher = None
                self.counters.publisher_since = None

    def publish(self, publisher: str, image: OutputFrame) -> None:
        """A processed frame of `publisher`; ignored unless it is the current publisher. Returns at once (it may
        be called on an event loop): the feed's thread fits and sends it, the newest only."""
        with self._lock:
            if publisher != self._publisher:
                return
            if self._pending is not None:
                self.counters.frames_superseded += 1
            self._pending = image
            self.counters.frames_published += 1
            self.counters.last_publisher_frame = self._clock()
            self._lock.notify()

    def publish_audio(self, publisher: str, frame: av.AudioFrame, due: float) -> None:
        if publisher != self._publisher:
            return
        for listener in list(self.audio_listeners):
            listener(frame, due)

    def probe(self, frames: int) -> None:
        """For the next `frames` frames, fill every gap longer than one interval, not only a publisher's pause: a
        client that opens the stream (FFmpeg's players wait for about 20 frames before they return) opens in 20
        intervals however slowly the publisher makes frames."""
        with self._lock:
            self._probe_left = max(self._probe_left, frames)
            self._lock.notify()

    def stats(self) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            c = self.counters
            last = c.last_publisher_frame
            showing = "published" if last is not None and now - last < GAP_S else self._filler(now)[0]
            return {
                "publisher": self._publisher,
                "showing": showing,
                "publisher_changes": c.publisher_changes,
                "frames_published": c.frames_published,
                "frames_held": c.frames_held,
                "frames_slate": c.frames_slate,
                "seconds_held": round(c.seconds_held, 1),
                "seconds_on_slate": round(c.seconds_on_slate, 1),
                "publishers": list(c.history),
            }

    def close(self) -> None:
        with self._lock:
            self._stopped = True
            self._lock.notify()
        self._thread.join(timeout=2.0)
        self.output_listeners.clear()
        self.audio_listeners.clear()
        self.keyframe_listeners.clear()

    # Filler thread.
    def _filler(self, now: float) -> tuple[str, OutputFrame]:
        """What fills in now: ("held", the last frame) within `hold_s` of it, else ("slate", the slate)."""
        last = self.counters.last_publisher_frame
        if self._last is not None and last is not None and now - last < self.hold_s:
            return "held", self._last
        return "slate", self.slate

    def _run(self) -> None:
        """Send each published frame as it comes; between them, fill in at the channel's rate."""
        interval = 1.0 / self.fps
        next_fill = self._clock()
        while True:
            with self._lock:
                while not self._stopped and self._pending is None and self._clock() < next_fill:
                    self._lock.wait(max(0.0, next_fill - self._clock()))
                if self._stopped:
                    return
                pending, self._pending = self._pending, None
                keyframe = pending is not None and self._keyframe_due
                if keyframe:
                    self._keyframe_due = False
            if pending is not None:
                self._send_published(pending, keyframe)
                next_fill = self._clock() + PROBE_GAP * interval  # the first time a fill may be due
                continue
            now = self._clock()
            next_fill = max(next_fill + interval, now)  # after a stall, go on from now rather than catch up
            with self._lock:
                last = self.counters.last_publisher_frame
                # While a client probes, a frame missing for a little more than an interval is filled in;
                # otherwise only a pause.
                gap = PROBE_GAP * interval if self._probe_left > 0 else GAP_S
                if last is not None and now - last < gap:
                    continue
                kind, image = self._filler(now)
                if kind == "held":
                    self.counters.frames_held += 1
                    self.counters.seconds_held += interval
                else:
                    self.counters.frames_slate += 1
                    self.counters.seconds_on_slate += interval
            self._send(image)

    def _send_published(self, frame: OutputFrame, keyframe: bool) -> None:
        """Sent as it is when it has the channel's size (its I420 form shared with the publisher's outputs)."""
        fits = frame.size == (self.width, self.height)
        sized = frame if fits else OutputFrame(letterbox(frame.image, self.width, self.height))
        with self._lock:
            self._last = sized
        if keyframe:
            for listener in list(self.keyframe_listeners):
                listener()
        self._send(sized)

    def _send(self, frame: OutputFrame) -> None:
        with self._lock:
            self._probe_left = max(0, self._probe_left - 1)
        for listener in list(self.output_listeners):
            try:
                listener(frame)
            except Exception:  # one consumer's failure must not starve the others or stop the feed
                self.counters.errors += 1
                if self.counters.errors == 1 or self.counters.errors % 1000 == 0:
                    log.exception("channel %s: an output refused a frame (%d so far)", self.name, self.counters.errors)
