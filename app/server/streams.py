"""RTSP ingest streams: pull a camera or file, swap every frame, publish the result on our RTSP server.

The pulling, reconnecting and frame dropping live in `app.media.rtsp_in.IngestWorker`, the processing in the
live core (`app.live`, as for WebRTC sessions: the same detection policy, hops and stats); this module admits
streams and connects the two.
"""

import asyncio
import contextlib
import dataclasses
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from app.egress.encode import SharedEncode
from app.live.adapter import LiveOutput, LiveRequest
from app.live.core import LiveCore
from app.live.frame import OutputFrame
from app.live.lazy_path import LazyPath, OpenPath
from app.media.rtsp_in import IngestWorker, RtspTransport, SourceForbidden, is_live_source
from app.observability import Metrics
from app.pipeline.identity_map import FaceSources
from app.pipeline.pipeline import FramePipeline
from app.pipeline.timing import StageTimer
from app.pipeline.types import Image
from app.runtime.batcher import BatcherError
from app.server.admission import Admission
from app.server.ingest_policy import CheckedSource, HostUnresolved, SourceRefused, coarse_error, redact_credentials
from app.server.output_guards import OutputGuards
from app.server.resource_errors import Conflict, NotFound, Unavailable
from app.server.rtsp import RtspOutput

log = logging.getLogger(__name__)

KIND = "stream"
PATH_FPS = 30  # the rate of a stream's own RTSP path (a source's own rate is not known before it plays)
# How long a new stream waits for its source's first open (its size makes the RTSP path exist at once).
PROBE_TIMEOUT_S = 5.0


class StreamNotFound(NotFound):
    what = "stream"


@dataclass(frozen=True)
class GiveUp:
    """When a live source that delivers nothing is given up on (the stream becomes `failed`, freeing its slot)."""

    attempts: int | None = None
    seconds: float | None = None


@dataclass
class StreamOrigin:
    """Where a stream's frames come from, as each party needs the address."""

    requested_url: str  # as the client sent it: checked again on every restart
    connect_url: str  # what ingest opens (credentials and the checked address included); renewed by each check
    display_url: str  # without credentials: what responses and logs show
    transport: RtspTransport = "tcp"  # how an RTSP source's media comes (interleaved on TCP, or RTP over UDP)

    @classmethod
    def of(
        cls, requested_url: str, checked: CheckedSource | None = None, transport: RtspTransport = "tcp"
    ) -> "StreamOrigin":
        """From the client's URL and the policy's check of it (none for a local file, opened as given)."""
        if checked is None:
            return cls(requested_url, requested_url, redact_credentials(requested_url), transport)
        return cls(requested_url, checked.connect_url, checked.display_url, transport)


class Stream(LiveOutput):
    def __init__(
        self, origin: StreamOrigin, identity_id: str, source: FaceSources, *, pipeline: FramePipeline, metrics: Metrics
    ) -> None:
        self.id = secrets.token_hex(16)
        self.origin = origin
        self.owner = ""
        self.core = LiveCore(
            kind=KIND,
            name=f"stream-{self.id}",
            identity_id=identity_id,
            source=source,
            pipeline=pipeline,
            metrics=metrics,
        )
        self.created = datetime.now(UTC).isoformat(timespec="seconds")
        self.rtsp_path = f"/stream/{self.id}"
        self.rtsp_url: str | None = None
        self.own_rtsp = True  # False when it publishes into a channel, which has the RTSP path
        self.channel: str | None = None
        self.worker: IngestWorker | None = None
        self.publisher: LazyPath | None = None
        self.state = "starting"
        self._counters_lock = threading.Lock()
        self._seen_in = 0
        self._seen_dropped = 0
        self.ended = asyncio.Event()

    def process(self, frames: list[Image]) -> list[OutputFrame]:
        """Called by the ingest worker's thread with its newest decoded frame; returns the swapped ones (the
        worker hands them to the RTSP publisher). A frame that fails is counted as dropped, as a session counts
        it, and the error goes on to the worker, which counts and logs it."""
        self.sync_counters()
        images = []
        for index, image in enumerate(frames):
            arrived = time.monotonic()
            timer = StageTimer()
            try:
                result = self.core.process(image, timer)
            except BatcherError:  # stale under load (deadline, queue full): the rest of the batch with it
                self.core.drop("stale", len(frames) - index)
                raise
            except Exception:
                self.core.drop("error", len(frames) - index)
                raise
            images.append(self.core.finished(result, timer))  # the frame its outputs share
            self.core.hops.observe("total", time.monotonic() - arrived)
            self.core.frame_out(arrived)
        return images

    def sync_counters(self) -> None:
        """Carry the worker's decoded and dropped frame counts over to the metrics."""
        worker = self.worker
        if worker is None:
            return
        try:
            stats = worker.stats()
        except Exception:  # a stopping worker may not answer; the next call catches up
            return
        frames_in, dropped = stats.frames_in, stats.dropped
        with self._counters_lock:
            fresh_in, fresh_dropped = frames_in - self._seen_in, dropped - self._seen_dropped
            self._seen_in, self._seen_dropped = max(frames_in, self._seen_in), max(dropped, self._seen_dropped)
        if fresh_in > 0:
            self.core.frame_in(count=fresh_in)
        if fresh_dropped > 0:
            self.core.drop("superseded", fresh_dropped)

    def on_state(self, state: str) -> None:
        self.state = state

    def _content_stop(self) -> str | None:
        gate = self.core.content
        return gate.stopped if gate is not None else None

    def _path_encode(self) -> SharedEncode | None:
        """The stream's own RTSP path's encode, once its first frame opened it."""
        return self.publisher.encode if self.publisher is not None else None

    def stats(self) -> dict[str, Any]:
        worker_stats: dict[str, Any] = {}
        if self.worker is not None:
            try:
                worker_stats = dataclasses.asdict(self.worker.stats())
            except Exception:  # a worker that is stopping may not answer
                worker_stats = {}
        state = self.worker.state if self.worker is not None else self.state
        error = coarse_error(worker_stats.get("last_error"))
        worker_stats["last_error"] = error
        return {
            "id": self.id,
            "source_url": self.origin.display_url,
            "source_transport": self.origin.transport,
            "state": str(state),
            "reason": error if state == "failed" else self._content_stop(),
            "created": self.created,
            **self.core.stats(),
            "rtsp_url": self.rtsp_url,
            "channel": self.channel,
            "stats": {k: v for k, v in worker_stats.items() if isinstance(v, int | float | str | None)},
            "egress": {"encode": encode.stats() if (encode := self._path_encode()) is not None else None},
        }


class StreamManager:
    def __init__(
        self,
        *,
        pipeline: FramePipeline,
        metrics: Metrics,
        rtsp: RtspOutput,
        max_streams: int,
        worker_factory: Callable[..., IngestWorker] = IngestWorker,
        max_per_owner: int | None = None,
        give_up: GiveUp | None = None,
        guards: OutputGuards | None = None,
        source_check: Callable[[str], CheckedSource] | None = None,
    ) -> None:
        self.pipeline = pipeline
        # The host policy and redirect refusal (IngestPolicy.check_and_probe), applied before every open of a live
        # source, reconnects included: a name may resolve elsewhere later, a source may start redirecting later.
        # The caller of `open` and `restart` applies it for the first open (a refused source costs no slot).
        self._source_check = source_check
        self._guards = guards or OutputGuards()
        self._metrics = metrics
        self._rtsp = rtsp
        self._worker_factory = worker_factory
        self._give_up = give_up or GiveUp()
        self._admission: Admission[Stream] = Admission(
            kind=KIND, capacity=max_streams, metrics=metrics, active=metrics.streams_active, per_owner=max_per_owner
        )
        # Streams whose source was given up on: listed with their reason, holding no slot, restartable.
        self._failed: dict[str, Stream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def unavailable_reason(self) -> str | None:
        if not self._rtsp.available:
            return f"RTSP output is off: {self._rtsp.reason}"
        return None

    def __len__(self) -> int:
        return len(self._admission)

    def streams(self) -> list[Stream]:
        return self._admission.items() + list(self._failed.values())

    def outputs(self) -> list[Stream]:  # the name every kind of live output answers to
        return self.streams()

    def rtsp_paths(self) -> list[str]:
        return [s.rtsp_path for s in self._admission.items()]

    def get(self, stream_id: str) -> Stream:
        stream = self._admission.get(stream_id) or self._failed.get(stream_id)
        if stream is None:
            raise StreamNotFound(stream_id)
        return stream

    def check_available(self) -> None:
        """`Unavailable` with the reason when streams cannot run here."""
        reason = self.unavailable_reason
        if reason is not None:
            raise Unavailable(reason)

    async def open(self, origin: StreamOrigin, request: LiveRequest) -> Stream:
        """Start pulling, swapping and publishing; the output carries a mark issued to this stream and `owner`.
        A live origin has just passed `source_check` (the caller checks the URL as the client gave it: a refused
        source then costs no slot and no mark)."""
        self.check_available()
        owner = request.owner
        with self._admission.reserve(owner):
            stream = Stream(origin, request.identity_id, request.source, pipeline=self.pipeline, metrics=self._metrics)
            stream.owner = owner
            stream.own_rtsp = request.own_rtsp
            stream.rtsp_url = self._rtsp.url(stream.rtsp_path) if request.own_rtsp else None
            await self._guards.equip(KIND, stream, request, self._stopper(stream))
            await self._start(stream)
            self._admission.admit(stream.id, stream, owner)
            return stream

    async def restart(self, stream_id: str, connect_url: str | None = None) -> Stream:
        """Start a failed stream again (at `connect_url` when its address was checked again)."""
        stream = self.get(stream_id)
        if stream_id not in self._failed:
            raise Conflict(f"stream {stream_id} is {stream.stats()['state']}; only a failed stream restarts")
        self.check_available()
        with self._admission.reserve(stream.owner):
            if connect_url is not None:
                stream.origin.connect_url = connect_url
            await self._start(stream, checked_now=connect_url is not None)
            del self._failed[stream_id]
            self._admission.admit(stream.id, stream, stream.owner)
            return stream

    def _path_opener(self, stream: Stream) -> OpenPath | None:
        """How the stream's own RTSP path is published at its size (none when it publishes into a channel)."""
        rtsp = self._rtsp
        if not stream.own_rtsp:
            return None
        return lambda width, height, audio: rtsp.publish(stream.rtsp_path, width, height, PATH_FPS, audio=audio)

    async def _start(self, stream: Stream, checked_now: bool = True) -> None:
        """Start the stream's worker at its `origin.connect_url`, which the caller has just checked when `checked_now`
        (`source_check`: its one look at the source answers for the worker's first open; every other open is
        checked first). Waits up to `PROBE_TIMEOUT_S` for that open, so that with the source's size known the RTSP
        path exists at once; otherwise it appears with the first frame. A new stream thus costs the source one
        DESCRIBE from the check and one from FFmpeg's open."""
        publisher = stream.publisher = LazyPath(self._path_opener(stream), f"stream {stream.id}")
        loop = self._loop = asyncio.get_running_loop()
        checked = self._source_check is not None and is_live_source(stream.origin.requested_url)
        first_open = threading.Event()  # the worker's first open is over, whether it worked or not

        def opened(width: int, height: int) -> None:
            publisher.open(width, height)
            first_open.set()

        def on_state(state: str) -> None:
            if state != "connecting":
                first_open.set()
            self._on_state(stream, state)

        try:
            worker = self._worker_factory(
                stream.origin.connect_url,
                stream.process,
                publisher,
                on_state=on_state,
                give_up_attempts=self._give_up.attempts,
                give_up_s=self._give_up.seconds,
                before_open=self._checks_after_the_first(stream, checked_now) if checked else None,
                on_open=opened,
                transport=stream.origin.transport,
            )
            stream.worker = worker
            await loop.run_in_executor(None, worker.start)
            await loop.run_in_executor(None, first_open.wait, PROBE_TIMEOUT_S)
        except BaseException as exc:
            await asyncio.shield(loop.run_in_executor(None, _stop_stream, stream))
            if isinstance(exc, Exception):
                raise Unavailable(f"cannot start the stream: {coarse_error(str(exc))}") from None
            raise

    def _checks_after_the_first(self, stream: Stream, checked_now: bool) -> Callable[[], str]:
        """The worker's `before_open`: the first open goes where the caller's check just looked (`checked_now`);
        every other one is checked first."""
        just_checked = checked_now

        def before_open() -> str:
            nonlocal just_checked
            if just_checked:
                just_checked = False
                return stream.origin.connect_url
            return self._check_before_open(stream)

        return before_open

    def _check_now(self, stream: Stream) -> str:
        """The stream's source checked again as the client gave it; what to open now. Blocks."""
        assert self._source_check is not None
        stream.origin.connect_url = self._source_check(stream.origin.requested_url).connect_url
        return stream.origin.connect_url

    def _check_before_open(self, stream: Stream) -> str:
        """For the ingest worker, before each open: a refusal fails the stream, a name that does not resolve
        now is retried like a source that does not answer."""
        try:
            return self._check_now(stream)
        except HostUnresolved as exc:
            raise OSError(str(exc)) from None
        except SourceRefused as exc:
            raise SourceForbidden(str(exc)) from None

    def _on_state(self, stream: Stream, state: str) -> None:
        """From the ingest thread: a stream that failed gives its slot back (on the event loop)."""
        stream.on_state(state)
        if state == "failed" and self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._failed_now, stream)

    def _failed_now(self, stream: Stream) -> None:
        if self._admission.release(stream.id) is None:
            return  # deleted meanwhile
        self._failed[stream.id] = stream
        log.warning("stream %s failed and freed its slot: %s", stream.id, stream.stats()["reason"])
        if self._loop is not None:
            self._loop.run_in_executor(None, _close_outputs, stream)

    def _stopper(self, stream: Stream) -> Callable[[str], None]:
        """What the content gate calls (from its own thread) to end `stream`: closed on the event loop."""
        loop = asyncio.get_running_loop()

        async def stop() -> None:
            with contextlib.suppress(StreamNotFound):  # closed meanwhile
                await self.close(stream.id)

        def request(reason: str) -> None:
            asyncio.run_coroutine_threadsafe(stop(), loop)

        return request

    async def close(self, stream_id: str) -> None:
        stream = self._admission.release(stream_id) or self._failed.pop(stream_id, None)
        if stream is None:
            raise StreamNotFound(stream_id)
        try:
            await asyncio.get_running_loop().run_in_executor(None, _stop_stream, stream)
        finally:
            stream.ended.set()

    async def close_all(self, grace_s: float) -> bool:
        """Refuse new streams and stop all running ones; False if some did not finish within `grace_s`."""
        self._failed.clear()
        return await self._admission.close_all(lambda s: self.close(s.id), grace_s)


def _close_outputs(stream: Stream) -> None:
    """A failed stream's worker has ended on its own; its RTSP path goes."""
    try:
        if stream.publisher is not None:
            stream.publisher.close()
    except Exception:
        log.exception("stream %s: RTSP publisher did not close cleanly", stream.id)


def _stop_stream(stream: Stream) -> None:
    try:
        if stream.worker is not None:
            stream.worker.stop()
            stream.sync_counters()
    except Exception:
        log.exception("stream %s: ingest worker did not stop cleanly", stream.id)
    stream.core.close()
    try:
        if stream.publisher is not None:
            stream.publisher.close()
    except Exception:
        log.exception("stream %s: RTSP publisher did not close cleanly", stream.id)
