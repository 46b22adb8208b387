"""What a path's video feed (`packet_feed.PacketFeed`) and audio feed (`audio_feed.AudioFeed`) share: one feeder thread
that hands each item its `_next` returns to the current media's appsrc (`_send`), counting and logging (once)
what fails, and the wait for a new media's pipeline to play before anything is pushed into it."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Generic, TypeVar

from app.egress.rtsp.bindings import Bindings

log = logging.getLogger(__name__)

# How long an item waits for a new media's pipeline to start playing before it is dropped.
START_TIMEOUT_S = 2.0

T = TypeVar("T")
NS = 1_000_000_000


def running_time_ns(appsrc: Any, at: float) -> int | None:
    """The running time of `appsrc`'s pipeline at the `time.monotonic()` instant `at` (None without a clock)."""
    clock = appsrc.get_clock()
    if clock is None:
        return None
    return int(clock.get_time() - appsrc.get_base_time() - (time.monotonic() - at) * NS)


class AppsrcFeeder(Generic[T]):
    """A feeder thread and the state it shares with callers (`_cond` guards `_appsrc` and `_closed`). A subclass
    sets up its own state, then calls `_start_feeding`; ``errors`` counts items `_send` failed on."""

    what = "items"  # for the log line

    def __init__(self, gst: Bindings, path: str, thread_name: str) -> None:
        self.path = path
        self.errors = 0
        self._gst = gst
        self._cond = threading.Condition()
        self._appsrc: Any = None
        self._playing: Any = None  # the last appsrc seen playing (asking GStreamer again for each item costs)
        self._closed = False
        self._thread = threading.Thread(target=self._feed, name=thread_name, daemon=True)

    def _start_feeding(self) -> None:
        self._thread.start()

    def join(self, timeout: float) -> None:
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=timeout)

    def _next(self) -> T | None:
        """Wait for what to send next; None once closed."""
        raise NotImplementedError

    def _send(self, item: T) -> None:
        raise NotImplementedError

    def _feed(self) -> None:
        while (item := self._next()) is not None:
            try:
                self._send(item)
            except Exception:
                self.errors += 1
                if self.errors == 1:
                    log.exception("RTSP %s: cannot hand %s to the encoder (counted from now on)", self.path, self.what)

    def _wait_playing(self, appsrc: Any) -> bool:
        """Wait (briefly) until the media's pipeline plays; False if it does not, or is replaced.

        A buffer pushed while the pipeline is still starting can reach the payloader without a
        timestamp, and the stream then stalls: the RTP sink waits for a running time far ahead. Once a media's
        appsrc was seen playing it is not asked again: it plays until it is replaced."""
        if appsrc is self._playing:
            return True
        playing = self._gst.Gst.State.PLAYING
        deadline = time.monotonic() + START_TIMEOUT_S
        while appsrc.get_state(0)[1] != playing:
            with self._cond:
                if self._closed or self._appsrc is not appsrc or time.monotonic() > deadline:
                    return False
                self._cond.wait(0.005)
        self._playing = appsrc
        return True
