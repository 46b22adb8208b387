"""Live ingest: pull a stream (RTSP, or any URL FFmpeg reads), process the newest frame, publish the result.

Two threads per worker. The reader opens the source with PyAV and decodes every frame into a
one-frame mailbox; the processor takes the newest frame from it, calls `process([frame])` and
pushes what comes back to an `RtspPublisher`. A slow `process` therefore drops frames (counted
in `dropped`) instead of building up delay.

A live source that drops or ends is reopened with exponential backoff, from
`reconnect_initial_s` up to `reconnect_max_s`, and forever: a camera that reboots comes back on
its own. A local file (for tests and demos) is read at its own frame rate and looped; a file
that cannot be opened, or holds no video, and a URL scheme FFmpeg does not know are permanent
failures.

States: ``connecting`` (first open), ``running`` (frames arriving), ``reconnecting`` (waiting or
reopening after a drop), ``stopped`` (by `stop`, or a file that ended without looping) and
``failed`` (will not retry; see `last_error`).
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import av
import av.error

from app.live.frame import OutputFrame
from app.media.mailbox import Mailbox
from app.pipeline.types import Image

log = logging.getLogger(__name__)

IngestState = Literal["connecting", "running", "reconnecting", "stopped", "failed"]
# How an RTSP source's media comes: interleaved on its control connection (TCP, the default: it passes NATs and
# firewalls and loses nothing) or as RTP/RTCP datagrams to ports the client names in its SETUP (UDP).
RtspTransport = Literal["udp", "tcp"]
RTSP_TRANSPORTS: tuple[RtspTransport, ...] = ("udp", "tcp")

LIVE_OPTIONS = {"rtsp_transport": "tcp", "fflags": "nobuffer", "flags": "low_delay"}


def live_options(transport: RtspTransport = "tcp") -> dict[str, str]:
    """FFmpeg's options for a live source whose RTSP media comes over `transport` (no fallback to the other)."""
    return LIVE_OPTIONS | {"rtsp_transport": transport}


class FrameSink(Protocol):
    """Where processed frames go: an `app.egress.rtsp.RtspPublisher`, or anything with its `push`."""

    def push(self, image: Image | OutputFrame) -> None: ...


@dataclass(frozen=True)
class IngestStats:
    """A snapshot of an ingest worker's counters.

    ``frames_in`` frames were decoded, ``frames_out`` images came back from `process`,
    ``dropped`` decoded frames were replaced by a newer one before `process` took them,
    ``reconnects`` counts reopen attempts after a drop and ``process_errors`` the calls of
    `process` that raised.
    """

    state: IngestState
    frames_in: int
    frames_out: int
    dropped: int
    reconnects: int
    process_errors: int
    last_error: str | None


class _SourceFailed(Exception):
    """The source cannot work, and retrying will not change that."""


class SourceForbidden(Exception):
    """Raised by a worker's `before_open` when the source may not be opened (any more): the worker fails."""


class _SourceUnusable(Exception):
    """The source opened but cannot be used now (a live stream without video, say); worth retrying."""


def is_live_source(url: str) -> bool:
    """True for network URLs (rtsp://, rtmp://, http://, srt://, ...), False for local files."""
    return "://" in url and not url.startswith("file:")


_PASSWORD_IN_URL = re.compile(r"(://[^:/@\s'\"]*):[^@/\s'\"]*@")


def redact_url(url: str) -> str:
    """`url` without a password, for logs: rtsp://user:secret@host/ becomes rtsp://user:***@host/."""
    return re.sub(r"^([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@]*):[^@/]*@", r"\1:***@", url)


class IngestWorker:
    """Pull `source_url`, run `process` on the newest frame, push the results to `publisher`."""

    def __init__(
        self,
        source_url: str,
        process: Callable[[list[Image]], Sequence[Image | OutputFrame]],
        publisher: FrameSink | None,
        *,
        on_state: Callable[[str], None] | None = None,
        reconnect_initial_s: float = 0.5,
        reconnect_max_s: float = 10.0,
        open_timeout_s: float = 5.0,
        read_timeout_s: float = 5.0,
        loop_file: bool = True,
        give_up_attempts: int | None = None,
        give_up_s: float | None = None,
        before_open: Callable[[], str] | None = None,
        on_open: Callable[[int, int], None] | None = None,
        transport: RtspTransport = "tcp",
    ) -> None:
        if reconnect_initial_s <= 0 or reconnect_max_s < reconnect_initial_s:
            raise ValueError("need 0 < reconnect_initial_s <= reconnect_max_s")
        self.source_url = source_url
        self.live = is_live_source(source_url)
        self._open_target = source_url.removeprefix("file://") if not self.live else source_url
        self._process = process
        self._publisher = publisher
        self._on_state = on_state
        self._reconnect_initial_s = reconnect_initial_s
        self._reconnect_max_s = reconnect_max_s
        self._timeout = (open_timeout_s, read_timeout_s)
        self._loop_file = loop_file
        # A live source that delivers no frame for this many opens in a row, or this long, is given up on.
        self._give_up_attempts = give_up_attempts
        self._give_up_s = give_up_s
        # Called right before every open of a live source (the first and each reconnect), on the reader thread:
        # returns the URL to open now, or raises `SourceForbidden` (the worker fails) or OSError (retried). A
        # host name may resolve elsewhere and a source may start redirecting after it was first checked.
        self._before_open = before_open
        # Called on the reader thread with the video's size each time the source opens with a video stream.
        self._on_open = on_open
        self._options = live_options(transport)

        self._log_name = redact_url(source_url)
        self._cond = threading.Condition()
        self._notify_lock = threading.RLock()
        self._stop = threading.Event()
        self._frames: Mailbox[av.VideoFrame] = Mailbox(cond=self._cond)
        self._source_done = False
        self._state: IngestState = "connecting"
        self._frames_in = 0
        self._frames_out = 0
        self._reconnects = 0
        self._process_errors = 0
        self._last_error: str | None = None
        self._session_frames = 0
        self._reader: threading.Thread | None = None
        self._processor: threading.Thread | None = None

    @property
    def state(self) -> IngestState:
        return self._state

    def stats(self) -> IngestStats:
        with self._cond:
            return IngestStats(
                state=self._state,
                frames_in=self._frames_in,
                frames_out=self._frames_out,
                dropped=self._frames.dropped,
                reconnects=self._reconnects,
                process_errors=self._process_errors,
                last_error=self._last_error,
            )

    def start(self) -> None:
        if self._reader is not None:
            raise RuntimeError("IngestWorker.start called twice")
        self._reader = threading.Thread(target=self._read_loop, name="ingest-read", daemon=True)
        self._processor = threading.Thread(target=self._process_loop, name="ingest-process", daemon=True)
        self._processor.start()
        self._reader.start()

    def stop(self, timeout: float = 5.0) -> bool:
        """Stop both threads; True when they ended within `timeout`.

        The processor ends at once. The reader ends after the frame it is reading, or when a
        blocked read times out (`read_timeout_s`); it is a daemon thread either way.
        """
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._set_state("stopped")
        deadline = time.monotonic() + timeout
        for thread in (self._processor, self._reader):
            if thread is not None and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
        return not any(t is not None and t.is_alive() for t in (self._processor, self._reader))

    def __enter__(self) -> IngestWorker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _describe(self, exc: BaseException) -> str:
        text = f"{type(exc).__name__}: {exc}".replace(self.source_url, self._log_name)
        return _PASSWORD_IN_URL.sub(r"\1:***@", text)  # the URL opened may differ from source_url (re-checked)

    # State.
    def _set_state(self, state: IngestState, error: str | None = None) -> None:
        # The notify lock keeps `on_state` calls in the order the states were set.
        with self._notify_lock:
            with self._cond:
                if error is not None:
                    self._last_error = error
                if self._state == state or self._state == "failed":
                    return
                if self._stop.is_set() and state != "stopped":
                    return
                self._state = state
            log.info("ingest %s: %s%s", self._log_name, state, f" ({error})" if error else "")
            if self._on_state is not None:
                try:
                    self._on_state(state)
                except Exception:
                    log.exception("ingest %s: on_state callback failed", self._log_name)

    # Reader thread.
    def _read_loop(self) -> None:
        delay = self._reconnect_initial_s
        fruitless = 0  # opens in a row that gave no frame
        fruitless_since = time.monotonic()
        while not self._stop.is_set():
            self._session_frames = 0
            try:
                self._read_source()
                frames = self._session_frames
                if self._stop.is_set():
                    break
                if not self.live:
                    if frames == 0:
                        raise _SourceFailed(f"{self._log_name} holds no decodable video frames")
                    if self._loop_file:
                        continue
                    self._finish_file()
                    return
                error = "source ended"
            except _SourceFailed as exc:
                self._fail(str(exc))
                return
            except SourceForbidden as exc:
                self._fail(f"source refused by the host policy: {exc}")
                return
            except av.error.ProtocolNotFoundError as exc:  # a typo in the scheme will not fix itself
                self._fail(self._describe(exc))
                return
            except (av.error.FFmpegError, OSError, _SourceUnusable) as exc:
                if not self.live:
                    self._fail(self._describe(exc))
                    return
                error = self._describe(exc)
            except Exception as exc:
                log.exception("ingest %s: unexpected error while reading", self._log_name)
                error = self._describe(exc)
            if self._stop.is_set():
                break
            if self._session_frames:
                delay = self._reconnect_initial_s
                fruitless, fruitless_since = 0, time.monotonic()
            else:
                fruitless += 1
                waited = time.monotonic() - fruitless_since
                if (self._give_up_attempts is not None and fruitless >= self._give_up_attempts) or (
                    self._give_up_s is not None and waited >= self._give_up_s
                ):
                    self._fail(f"gave up after {fruitless} attempts in {waited:.0f} s without a frame: {error}")
                    return
            with self._cond:
                self._reconnects += 1
            self._set_state("reconnecting", error)
            self._stop.wait(delay)
            delay = min(delay * 2, self._reconnect_max_s)

    def _read_source(self) -> None:
        """Open the source and decode until it ends, counting frames in `_session_frames`."""
        if not self.live and not Path(self._open_target).is_file():
            raise _SourceFailed(f"no such file: {self._open_target}")
        if self.live:
            target = self._before_open() if self._before_open is not None else self._open_target
            container = av.open(target, options=self._options, timeout=self._timeout)
        else:
            container = av.open(self._open_target)
        try:
            if not container.streams.video:
                message = f"{self._log_name} has no video stream"
                raise _SourceUnusable(message) if self.live else _SourceFailed(message)
            stream = container.streams.video[0]
            width, height = int(stream.codec_context.width), int(stream.codec_context.height)
            if self._on_open is not None and width > 0 and height > 0:
                self._on_open(width, height)
            rate = float(stream.average_rate) if stream.average_rate else 30.0
            start_wall = 0.0
            start_time = 0.0
            for frame in container.decode(stream):
                if self._stop.is_set():
                    break
                if not self.live:
                    # Play a file at its own pace, as a camera would deliver it.
                    t = frame.time if frame.time is not None else self._session_frames / rate
                    if self._session_frames == 0:
                        start_wall, start_time = time.monotonic(), t
                    wait = start_wall + (t - start_time) - time.monotonic()
                    if wait > 0 and self._stop.wait(wait):
                        break
                self._offer(frame)
                self._session_frames += 1
                if self._session_frames == 1:
                    self._set_state("running")
        finally:
            container.close()

    def _offer(self, frame: av.VideoFrame) -> None:
        with self._cond:
            self._frames.put(frame)
            self._frames_in += 1

    def _end_source(self) -> None:
        """No frame will come any more: the processor handles what is queued and returns."""
        with self._cond:
            self._source_done = True
            self._cond.notify_all()

    def _fail(self, error: str) -> None:
        log.warning("ingest %s failed: %s", self._log_name, error)
        self._set_state("failed", error)
        self._end_source()

    def _finish_file(self) -> None:
        self._end_source()
        if self._processor is not None:
            self._processor.join()
        self._set_state("stopped")

    # Processor thread.
    def _process_loop(self) -> None:
        while True:
            with self._cond:
                while not self._frames.has_item and not self._stop.is_set() and not self._source_done:
                    self._cond.wait()
                frame = self._frames.take()
                if self._stop.is_set() or frame is None:
                    return
            self._handle(frame)

    def _handle(self, frame: Any) -> None:
        try:
            image: Image = frame.to_ndarray(format="bgr24")
            results = self._process([image])
        except Exception as exc:
            with self._cond:
                self._process_errors += 1
                self._last_error = f"process failed: {self._describe(exc)}"
                first = self._process_errors == 1
            if first:
                log.exception("ingest %s: process failed (further failures are counted only)", self._log_name)
            return
        with self._cond:
            self._frames_out += len(results)
        if self._publisher is not None:
            for result in results:
                self._publisher.push(result)
