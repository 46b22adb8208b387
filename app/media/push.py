"""`Push`: a channel's picture and sound sent on to one destination (`app.media.push_sinks`), on a thread of its
own so that a slow or failing destination never holds up the channel or its other outputs.

It listens to the channel's feed like any output: `frame` keeps only the newest frame (a destination that
takes frames slower than they come loses frames, never time), `audio` queues a bounded amount of sound, and
`keyframe` asks for a keyframe (a new publisher). Its thread sends at the channel's rate, one frame per tick
(the newest, or the one before again when none came), and the sound up to the same instant, with silence
where none came, so platforms get the constant-rate stream with a continuous audio track they expect.

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

import av
import cv2
import numpy as np

from app.live.frame import OutputFrame, to_i420
from app.media.encoder import EncoderPolicy
from app.media.push_destination import Destination
from app.media.push_sinks import AUDIO_RATE
from app.media.push_worker import ProcessSink

log = logging.getLogger(__name__)

State = Literal["connecting", "waiting", "live", "retrying", "stopped"]
STABLE_S = 10.0  # a connection that held this long resets the pause before the next attempt
AUDIO_MAX_S = 0.5  # sound queued beyond this (the destination is slow) is dropped, oldest first
AUDIO_KEEP_S = 0.1  # what is left when it is
BITRATE_WINDOW_S = 2.0
ERROR_MAX = 300  # characters of an error kept (FFmpeg's may go on with a whole SDP offer)

Planes = np.ndarray[Any, np.dtype[np.uint8]]
Samples = np.ndarray[Any, np.dtype[np.float32]]


class Connection(Protocol):
    """One connection to the destination (`ProcessSink`: an encoder and muxer in a child process)."""

    audio_frame_samples: int

    def connected(self) -> bool: ...

    def sent(self) -> int: ...

    def send_video(self, i420: Planes, pts: int, keyframe: bool) -> None: ...

    def send_audio(self, planar: Samples, pts: int) -> None: ...

    def close(self) -> None: ...


Opener = Callable[[Destination, int, int, int, EncoderPolicy], Connection]


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
        width: int,
        height: int,
        fps: int,
        policy: EncoderPolicy,
        *,
        backoff_s: float = 1.0,
        backoff_max_s: float = 30.0,
        opener: Opener = ProcessSink,
    ) -> None:
        self.id = push_id
        self.destination = destination
        self.width, self.height, self.fps = width, height, fps
        self._policy = policy
        self._backoff = (backoff_s, backoff_max_s)
        self._open = opener
        self.counters = PushCounters()
        self._lock = threading.Condition()
        self._newest: OutputFrame | None = None
        self._fresh = False
        self._keyframe = True
        self._audio: collections.deque[av.AudioFrame] = collections.deque()
        self._audio_queued = 0.0  # seconds
        self._sent: collections.deque[tuple[float, int]] = collections.deque()  # (monotonic, bytes) recent
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"push-{push_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ------------------------------------------------------------------------------ the feed's listeners

    def frame(self, frame: OutputFrame) -> None:
        with self._lock:
            if self._fresh:
                self.counters.frames_dropped += 1
            self._newest, self._fresh = frame, True

    def audio(self, frame: av.AudioFrame, due: float) -> None:
        seconds = frame.samples / (frame.sample_rate or AUDIO_RATE)
        with self._lock:
            self._audio.append(frame)
            self._audio_queued += seconds
            while self._audio_queued > AUDIO_MAX_S and self._audio:
                dropped = self._audio.popleft()
                lost = dropped.samples / (dropped.sample_rate or AUDIO_RATE)
                self._audio_queued -= lost
                self.counters.audio_dropped_s += lost

    def keyframe(self) -> None:
        with self._lock:
            self._keyframe = True

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

    def close(self, timeout: float = 15.0) -> None:
        """Stop sending and close the connection (blocking: at most `timeout`, the muxer's own timeouts)."""
        self._stopped.set()
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
                sink = self._open(self.destination, self.width, self.height, self.fps, self._policy)
            except Exception as exc:  # unreachable, refused, a bad key: reported, and tried again later
                self._failed(exc)
            else:
                with self._lock:
                    self.counters.connects += 1
                    if self.counters.connects > 1:
                        self.counters.reconnects += 1
                try:
                    self._stream(sink)
                except Exception as exc:  # dropped by the destination
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
        """Send one frame per tick, and the sound up to it, until stopped or the sink fails."""
        interval = 1.0 / self.fps
        start = time.monotonic()
        ticks = 0
        audio = _AudioClock(sink.audio_frame_samples)
        with self._lock:
            self._keyframe = True  # every connection starts on one
            self._audio.clear()
            self._audio_queued = 0.0
        last: Planes | None = None
        state: State | None = None
        while not self._stopped.is_set():
            now_state: State = "live" if sink.connected() else "waiting"
            if now_state != state:
                self._set_state(now_state)
                state = now_state
            with self._lock:
                frame, fresh = self._newest, self._fresh
                self._fresh = False
                keyframe, self._keyframe = self._keyframe, False
                pending = list(self._audio)
                self._audio.clear()
                self._audio_queued = 0.0
            if fresh and frame is not None:
                last = self._planes(frame)
            elif last is not None:
                with self._lock:
                    self.counters.frames_repeated += 1
            if last is not None:
                sink.send_video(last, ticks, keyframe)
                ticks += 1
                for chunk, pts in audio.take(pending, ticks / self.fps):
                    sink.send_audio(chunk, pts)
            size = sink.sent()
            with self._lock:
                self.counters.frames_sent += 1 if last is not None else 0
                self.counters.bytes_sent += size
                now = time.monotonic()
                self._sent.append((now, size))
                while self._sent and now - self._sent[0][0] > BITRATE_WINDOW_S:
                    self._sent.popleft()
            delay = start + ticks * interval - time.monotonic()
            if delay < -1.0:  # fell a second behind (a stall): go on from now rather than catch up in a burst
                start = time.monotonic() - ticks * interval
            elif delay > 0:
                self._stopped.wait(delay if last is not None else interval)

    def _planes(self, frame: OutputFrame) -> Planes:
        """The I420 planes at the push's size (the channel's frames have it: their planes, converted once)."""
        if frame.size != (self.width, self.height) or not frame.even:
            resized = cv2.resize(frame.image, (self.width, self.height), interpolation=cv2.INTER_AREA)
            return to_i420(np.asarray(resized, np.uint8))
        return frame.i420()


class _AudioClock:
    """The push's sound as encoder-sized frames of 48 kHz stereo: what came, resampled, and silence where
    nothing came, laid so that the sound sent always reaches the video's time."""

    def __init__(self, frame_samples: int) -> None:
        self.frame_samples = frame_samples
        self.sent = 0  # samples
        self._buffer = np.zeros((2, 0), np.float32)
        self._resampler: av.AudioResampler | None = None
        self._input: tuple[str, str, int] | None = None

    def take(self, frames: list[av.AudioFrame], until_s: float) -> list[tuple[Samples, int]]:
        """Encoder-sized chunks of planar samples, with their timestamps (in samples), up to `until_s`."""
        for frame in frames:
            self._buffer = np.concatenate([self._buffer, self._planar(frame)], axis=1)
        # Keep no more than a little beyond the video's time: the rest is late and would only add delay.
        excess = self._buffer.shape[1] - round((AUDIO_MAX_S) * AUDIO_RATE)
        if excess > 0:
            self._buffer = self._buffer[:, excess:]
        target = round(until_s * AUDIO_RATE)
        out = []
        while self.sent + self.frame_samples <= target:
            chunk = self._buffer[:, : self.frame_samples]
            self._buffer = self._buffer[:, chunk.shape[1] :]
            if chunk.shape[1] < self.frame_samples:
                chunk = np.concatenate([chunk, np.zeros((2, self.frame_samples - chunk.shape[1]), np.float32)], axis=1)
            out.append((np.ascontiguousarray(chunk), self.sent))
            self.sent += self.frame_samples
        return out

    def _planar(self, frame: av.AudioFrame) -> Samples:
        kind = (frame.format.name, frame.layout.name, frame.sample_rate)
        if self._resampler is None or kind != self._input:
            self._resampler = av.AudioResampler(format="fltp", layout="stereo", rate=AUDIO_RATE)
            self._input = kind
        frame.pts = None  # the resampler would otherwise follow the sender's clock
        parts = [np.asarray(f.to_ndarray(), np.float32) for f in self._resampler.resample(frame)]
        return np.concatenate(parts, axis=1) if parts else np.zeros((2, 0), np.float32)
