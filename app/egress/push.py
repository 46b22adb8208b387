"""`Push`: a channel's picture and sound sent on to one destination (`app.egress.push_sinks`), on a thread of its
own so that a slow or failing destination never holds up the channel, its encode or its other pushes.

The channel's pushes share one encode (`app.egress.encode`): a push attaches to it while connected and
gets its packets in a bounded queue, which `packet` fills without ever waiting. A push starts on a keyframe:
what comes before the first one (sound included) is not sent. A push whose destination takes the packets
slower than they come drops its queue and waits for the next keyframe (asking the encode for one), so it loses
time of its own, never the encode's or the other pushes'.

A push takes the encode's packets only while its connection takes them: an SRT listener that waits for its
caller (or a caller that waits for its listener) leaves the encode, which stops when nothing else uses it, and
joins it again (on a keyframe, its timestamps going on from where they were) when the peer comes.

A sink that fails (refused, dropped, unreachable, or accepted and then silent until the watchdog ends it) is
closed and opened again after a pause that doubles from `backoff_s` up to `backoff_max_s` with every attempt
that ends, and goes back to `backoff_s` only after a connection delivered to a peer for `STABLE_S`. Each
attempt runs a child process (`app.egress.push_worker`): the server's `WorkerSlots` bound how many run at once,
and a push waits ("queued") for a slot. Errors are kept with the destination's secrets redacted.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from app.egress.encode import EncodedPacket, SharedEncode
from app.egress.push_destination import Destination
from app.egress.push_errors import classify, shown
from app.egress.push_sinks import AUDIO_CODECS
from app.egress.push_worker import ProcessSink, SinkState

log = logging.getLogger(__name__)

State = Literal["queued", "connecting", "waiting", "live", "retrying", "stopped"]
STABLE_S = 10.0  # a connection live (delivering to a peer) this long resets the pause before the next attempt
QUEUE_MAX_S = 1.0  # video queued beyond this (the destination is slow) is dropped, up to the next keyframe
BITRATE_WINDOW_S = 2.0
ERROR_MAX = 300  # characters of an error kept (FFmpeg's may go on with a whole SDP offer)
WAKE_S = 0.25  # how often the thread looks at its connection's state when no packet comes


class Connection(Protocol):
    """One connection to the destination (`ProcessSink`: a muxer in a child process)."""

    def state(self) -> SinkState: ...

    def wants_packets(self) -> bool: ...

    def sent(self) -> int: ...

    def send(self, packet: EncodedPacket, pts_us: int) -> None: ...

    def close(self) -> None: ...


Opener = Callable[[Destination, int, int, int], Connection]


class WorkerSlots:
    """The server's bound on push attempts running at once (each a child process of ~120 MB)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free = threading.Semaphore(limit)

    def take_now(self) -> bool:
        """A slot if one is free now."""
        return self._free.acquire(blocking=False)

    def take(self, stopped: threading.Event) -> bool:
        """Waits for a free slot; False when `stopped` is set first."""
        while not stopped.is_set():
            if self._free.acquire(timeout=WAKE_S):
                return True
        return False

    def give_back(self) -> None:
        self._free.release()


@dataclass
class PushCounters:
    state: State = "connecting"
    connects: int = 0
    reconnects: int = 0
    frames_sent: int = 0
    frames_dropped: int = 0  # frames replaced by a newer one before they were sent
    bytes_sent: int = 0
    audio_dropped_s: float = 0.0
    last_error: str | None = None  # its class, as the owner sees it
    last_error_detail: str | None = None  # the reason, for the server's log only
    last_error_at: float | None = None  # wall-clock time
    live_since: float | None = None  # wall-clock time
    failures: int = 0  # attempts that ended since the push was last live for STABLE_S
    next_retry_at: float | None = None  # wall-clock time of the next attempt, while retrying


class Push:
    def __init__(
        self,
        push_id: str,
        destination: Destination,
        encode: SharedEncode,
        *,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        opener: Opener = ProcessSink,
        slots: WorkerSlots | None = None,
    ) -> None:
        self.id = push_id
        self.destination = destination
        self.encode = encode
        self.audio_codec = AUDIO_CODECS[destination.kind]
        self._backoff = (backoff_s, backoff_max_s)
        self._open = opener
        self._slots = slots
        self.credential: str | None = None  # what added it (its owner's revocation ends it)
        self._live_at: float | None = None  # monotonic, while live
        self._live_s = 0.0  # the longest time live in the current attempt
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
            retry_at = c.next_retry_at if c.state == "retrying" else None
            return {
                "state": c.state,
                "bitrate_kbps": round(recent * 8 / BITRATE_WINDOW_S / 1000, 1),
                "connects": c.connects,
                "reconnects": c.reconnects,
                "frames_sent": c.frames_sent,
                "frames_dropped": c.frames_dropped,
                "bytes_sent": c.bytes_sent,
                "audio_dropped_s": round(c.audio_dropped_s, 2),
                "last_error": c.last_error,
                "last_error_at": c.last_error_at,
                "live_since": c.live_since,
                "failures": c.failures,
                "next_retry_at": retry_at,
                "retry_in_s": None if retry_at is None else round(max(0.0, retry_at - time.time()), 1),
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
        now = time.monotonic()
        with self._lock:
            if self.counters.state == "live" and state != "live" and self._live_at is not None:
                self._live_s = max(self._live_s, now - self._live_at)
                self._live_at = None
            if state == "live" and self.counters.state != "live":
                self._live_at = now
            self.counters.state = state
            if state == "live":
                self.counters.live_since = time.time()
            elif state != "waiting":
                self.counters.live_since = None

    # ------------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        pause = self._backoff[0]
        while not self._stopped.is_set():
            if self._slots is not None and not self._slots.take_now():
                self._set_state("queued")
                if not self._slots.take(self._stopped):
                    break
            try:
                self._attempt()
            finally:
                if self._slots is not None:
                    self._slots.give_back()
            if self._stopped.is_set():
                break
            # Only a connection that delivered to a peer for a while starts the pauses over: one that was
            # accepted and then stalled (killed by the watchdog) failed like any other and waits longer.
            live_s = self._live_s
            with self._lock:
                if live_s >= STABLE_S:
                    pause = self._backoff[0]
                    self.counters.failures = 0
                self.counters.failures += 1
                self.counters.next_retry_at = round(time.time() + pause, 3)
            self._set_state("retrying")
            self._stopped.wait(pause)
            pause = min(pause * 2, self._backoff[1])
        with self._lock:
            self.counters.next_retry_at = None
        self._set_state("stopped")

    def _attempt(self) -> None:
        """One connection: a child process from its start to its end (failed, or the push stopped)."""
        self._set_state("connecting")
        with self._lock:
            self._live_s, self._live_at = 0.0, None
        try:
            sink = self._open(self.destination, self.encode.width, self.encode.height, self.encode.fps)
        except Exception as exc:  # the child process did not start: reported, and tried again later
            self._failed(exc)
            return
        try:
            self._stream(sink)
        except Exception as exc:  # unreachable, refused, a bad key, or dropped by the destination
            self._failed(exc)
        finally:
            self._set_state("connecting")  # the time live ends here
            try:
                sink.close()
            except Exception:  # closing what already failed: nothing more to do
                log.debug("push %s: closing its sink failed", self.id, exc_info=True)

    def _failed(self, exc: Exception) -> None:
        """The owner sees the failure's class (`app.egress.push_errors`); the server's log has the reason."""
        text = str(exc).strip() or type(exc).__name__
        detail = self.destination.redact(text.splitlines()[0])[:ERROR_MAX]
        with self._lock:
            repeated = detail == self.counters.last_error_detail
            self.counters.last_error = shown(classify(exc))
            self.counters.last_error_detail = detail
            self.counters.last_error_at = round(time.time(), 3)
        # Logged when it changes: a destination that stays away retries for hours.
        log.log(
            logging.DEBUG if repeated else logging.WARNING,
            "push %s to %s failed: %s",
            self.id,
            self.destination.shown,
            detail,
        )

    def _stream(self, sink: Connection) -> None:
        """Send the encode's packets from a keyframe on, until stopped or the sink fails."""
        while sink.state() == "starting":  # packets sent now would only wait in the pipe
            if self._stopped.wait(0.05):
                return
        try:
            self._send_packets(sink)
        finally:
            self.encode.detach(self)

    def _join(self, attach: bool) -> None:
        """Take the encode's packets (from a keyframe on: attaching asks for one) or stop taking them."""
        with self._lock:
            self._queue.clear()
            self._queued_video = 0
            self._keyed = False
        if attach:
            self.encode.attach(self)
        else:
            self.encode.detach(self)

    def _send_packets(self, sink: Connection) -> None:
        state: State = "connecting"
        attached = False
        frame_us = 1_000_000 // max(1, self.encode.fps)
        # The connection's clock: each time the push joins the encode, its first keyframe goes on from the last
        # packet sent (the encode's own clock starts over when it stopped meanwhile).
        start_us: int | None = None
        base_us = last_us = 0
        while not self._stopped.is_set():
            now_state: State = "connecting" if (said := sink.state()) == "starting" else said
            if now_state != state:
                if state == "connecting":
                    with self._lock:
                        self.counters.connects += 1
                        self.counters.reconnects += self.counters.connects > 1
                self._set_state(now_state)
                state = now_state
            wanted = sink.wants_packets()
            if wanted != attached:
                self._join(wanted)
                attached = wanted
                start_us, base_us = None, (last_us + frame_us if last_us else 0)
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
                pts_us = base_us + packet.pts_us - start_us
                sink.send(packet, pts_us)
                last_us = max(last_us, pts_us)
                if packet.video:
                    with self._lock:
                        self.counters.frames_sent += 1
            size = sink.sent()
            with self._lock:
                self.counters.bytes_sent += size
                now = time.monotonic()
                self._sent.append((now, size))
                while self._sent and now - self._sent[0][0] > BITRATE_WINDOW_S:
                    self._sent.popleft()
