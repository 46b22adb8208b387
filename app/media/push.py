"""`Push`: a channel's picture and sound sent on to one destination (`app.media.push_sinks`), on a thread of its
own so that a slow or failing destination never holds up the channel, its encode or its other pushes.

The channel's pushes share one encode (`app.media.push_encode`): a push attaches to it while connected and
gets its packets in a bounded queue, which `packet` fills without ever waiting. A push starts on a keyframe:
what comes before the first one (sound included) is not sent. A push whose destination takes the packets
slower than they come drops its queue and waits for the next keyframe (asking the encode for one), so it loses
time of its own, never the encode's or the other pushes'.

A sink that fails (refused, dropped, unreachable) is closed and opened again after a pause that doubles from
`backoff_s` up to `backoff_max_s`, and goes back to `backoff_s` once a connection has held for `STABLE_S`.
Errors are kept with the destination's secrets redacted.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.media.push_destination import Destination
from app.media.push_encode import EncodedPacket, PushEncode
from app.media.push_sinks import AUDIO_CODECS
from app.media.push_worker import ProcessSink, SinkState

log = logging.getLogger(__name__)

State = Literal["connecting", "waiting", "live", "retrying", "stopped"]
STABLE_S = 10.0  # a connection that held this long resets the pause before the next attempt
QUEUE_MAX_S = 1.0  # video queued beyond this (the destination is slow) is dropped, up to the next keyframe
BITRATE_WINDOW_S = 2.0
ERROR_MAX = 300  # characters of an error kept (FFmpeg's may go on with a whole SDP offer)
WAKE_S = 0.25  # how often the thread looks at its connection's state when no packet comes


class Connection(Protocol):
    """One connection to the destination (`ProcessSink`: a muxer in a child process)."""

    def state(self) -> SinkState: ...

    def sent(self) -> int: ...

    def send(self, packet: EncodedPacket, pts_us: int) -> None: ...

    def close(self) -> None: ...


Opener = Callable[[Destination, int, int, int], Connection]


@dataclass
class PushCounters:
    state: State = "connecting"
    connects: int = 0
    reconnects: int = 0
    frames_sent: int = 0
    frames_repeated: int = 0  # ticks with no new frame: the last one sent again
    frames_dropped: int = 0  # frames replaced by a newer one before they were sent
    bytes_sent: int = 0
    audio_dropped_s: float = 0.0
    last_error: str | None = None
    last_error_at: float | None = None  # wall-clock time
    live_since: float | None = None  # wall-clock time


class Push:
    def __init__(
        self,
        push_id: str,
        destination: Destination,
        encode: PushEncode,
        *,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        opener: Opener = ProcessSink,
    ) -> None:
        self.id = push_id
        self.destination = destination
        self.encode = encode
        self.audio_codec = AUDIO_CODECS[destination.kind]
        self._backoff = (backoff_s, backoff_max_s)
        self._open = opener
        self.counters = PushCounters()
        self._lock = threading.Condition()
        self._queue: collections.deque[EncodedPacket] = collections.deque()
        self._queued_video = 0
        self._keyed = False  # the queue starts on a keyframe (none is queued before one came)
        self._sent: collections.deque[tuple[float, int]] = collections.deque()  # (monotonic, bytes) recent
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"push-{push_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ------------------------------------------------------------------------------ the encode's subscriber

    def packet(self, packet: EncodedPacket) -> None:
        """Queued, from the first keyframe on; never waits (called on the encode's thread)."""
        overflow = False
        with self._lock:
            self.counters.frames_dropped += packet.dropped
            self.counters.audio_dropped_s += packet.audio_dropped_s
            if not self._keyed and not (packet.video and packet.keyframe):
                self._count_dropped(packet)
                return
            self._keyed = True
            self._queue.append(packet)
            self._queued_video += packet.video
            if self._queued_video > QUEUE_MAX_S * self.encode.fps:
                overflow = True
                for dropped in self._queue:
                    self._count_dropped(dropped)
                self._queue.clear()
                self._queued_video = 0
                self._keyed = False
            self._lock.notify()
        if overflow:
            self.encode.keyframe()

    def _count_dropped(self, packet: EncodedPacket) -> None:
        if packet.video:
            self.counters.frames_dropped += 1

    # ------------------------------------------------------------------------------ state

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        with self._lock:
            c = self.counters
            recent = sum(size for at, size in self._sent if now - at <= BITRATE_WINDOW_S)
            return {
                "state": c.state,
                "bitrate_kbps": round(recent * 8 / BITRATE_WINDOW_S / 1000, 1),
                "connects": c.connects,
                "reconnects": c.reconnects,
                "frames_sent": c.frames_sent,
                "frames_repeated": c.frames_repeated,
                "frames_dropped": c.frames_dropped,
                "bytes_sent": c.bytes_sent,
                "audio_dropped_s": round(c.audio_dropped_s, 2),
                "last_error": c.last_error,
                "last_error_at": c.last_error_at,
                "live_since": c.live_since,
            }

    def stop(self) -> None:
        """Ask the thread to stop (returns at once; `close` waits for it)."""
        self._stopped.set()
        with self._lock:
            self._lock.notify()

    def close(self, timeout: float = 15.0) -> None:
        """Stop sending and close the connection (blocking: at most `timeout`, the muxer's own timeouts)."""
        self.stop()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _set_state(self, state: State) -> None:
        with self._lock:
            self.counters.state = state
            if state == "live":
                self.counters.live_since = time.time()
            elif state != "waiting":
                self.counters.live_since = None

    # ------------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        pause = self._backoff[0]
        while not self._stopped.is_set():
            self._set_state("connecting")
            started = time.monotonic()
            try:
                sink = self._open(self.destination, self.encode.width, self.encode.height, self.encode.fps)
            except Exception as exc:  # the child process did not start: reported, and tried again later
                self._failed(exc)
            else:
                try:
                    self._stream(sink)
                except Exception as exc:  # unreachable, refused, a bad key, or dropped by the destination
                    self._failed(exc)
                finally:
                    try:
                        sink.close()
                    except Exception:  # closing what already failed: nothing more to do
                        log.debug("push %s: closing its sink failed", self.id, exc_info=True)
            if self._stopped.is_set():
                break
            if time.monotonic() - started >= STABLE_S:
                pause = self._backoff[0]
            self._set_state("retrying")
            self._stopped.wait(pause)
            pause = min(pause * 2, self._backoff[1])
        self._set_state("stopped")

    def _failed(self, exc: Exception) -> None:
        text = str(exc).strip() or type(exc).__name__
        message = self.destination.redact(text.splitlines()[0])[:ERROR_MAX]
        with self._lock:
            repeated = message == self.counters.last_error
            self.counters.last_error = message
            self.counters.last_error_at = round(time.time(), 3)
        # Logged when it changes: a destination that stays away retries for hours.
        log.log(
            logging.DEBUG if repeated else logging.WARNING,
            "push %s to %s failed: %s",
            self.id,
            self.destination.shown,
            message,
        )

    def _stream(self, sink: Connection) -> None:
        """Send the encode's packets from a keyframe on, until stopped or the sink fails."""
        with self._lock:
            self._queue.clear()
            self._queued_video = 0
            self._keyed = False
        while sink.state() == "starting":  # packets sent now would only wait in the pipe
            if self._stopped.wait(0.05):
                return
        self.encode.attach(self)
        try:
            self._send_packets(sink)
        finally:
            self.encode.detach(self)

    def _send_packets(self, sink: Connection) -> None:
        state: State = "connecting"
        start_us: int | None = None  # the connection's first keyframe: its time zero
        while not self._stopped.is_set():
            now_state: State = "connecting" if (said := sink.state()) == "starting" else said
            if now_state != state:
                if state == "connecting":
                    with self._lock:
                        self.counters.connects += 1
                        self.counters.reconnects += self.counters.connects > 1
                if now_state == "live" and state == "waiting":
                    self.encode.keyframe()  # a peer came: what it gets starts on one
                self._set_state(now_state)
                state = now_state
            with self._lock:
                if not self._queue and not self._stopped.is_set():
                    self._lock.wait(WAKE_S)
                packets = list(self._queue)
                self._queue.clear()
                self._queued_video = 0
            for packet in packets:
                if start_us is None:
                    start_us = packet.pts_us  # the queue starts on a keyframe
                if packet.pts_us < start_us:
                    continue  # sound from before the first picture
                sink.send(packet, packet.pts_us - start_us)
                if packet.video:
                    with self._lock:
                        self.counters.frames_sent += 1
                        self.counters.frames_repeated += packet.repeated
            size = sink.sent()
            with self._lock:
                self.counters.bytes_sent += size
                now = time.monotonic()
                self._sent.append((now, size))
                while self._sent and now - self._sent[0][0] > BITRATE_WINDOW_S:
                    self._sent.popleft()
