"""RTSP ingest streams: pull a camera or file, swap every frame, publish the result on our RTSP server.

The pulling, reconnecting and frame dropping live in `app.media.rtsp_in.IngestWorker`; this module admits
streams, gives each its own tracker and identity, and feeds the metrics.
"""

import asyncio
import dataclasses
import importlib
import logging
import secrets
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import av

from app.media.webrtc import AdmissionError
from app.observability import Metrics
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.pipeline.timing import StageTimer
from app.pipeline.types import Image
from app.server.rtsp import RtspOutput

log = logging.getLogger(__name__)

KIND = "stream"
PROBE_TIMEOUT_S = 5.0


class StreamNotFound(LookupError):
    def __init__(self, stream_id: str) -> None:
        super().__init__(f"stream {stream_id} not found")


class StreamsUnavailable(Exception):
    """RTSP ingest or output cannot run here; the message says why."""


class LazyPublisher:
    """Opens the RTSP path at the first frame, when the output size is known. Thread-safe like the publisher."""

    def __init__(self, rtsp: RtspOutput, path: str, fps: int = 30) -> None:
        self._rtsp = rtsp
        self._path = path
        self._fps = fps
        self._lock = threading.Lock()
        self._publisher: Any = None
        self._closed = False

    def open(self, width: int, height: int) -> None:
        """Publish the path now, at this size (when the source's size is known before its first frame)."""
        with self._lock:
            if self._publisher is None and not self._closed:
                self._publisher = self._rtsp.publish(self._path, width, height, self._fps)

    def push(self, image: Image) -> None:
        with self._lock:
            if self._closed:
                return
            if self._publisher is None:
                height, width = image.shape[:2]
                self._publisher = self._rtsp.publish(self._path, width, height, self._fps)
            publisher = self._publisher
        publisher.push(image)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close()


def probe_size(source_url: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, int] | None:
    """The source's frame size, or None when it cannot be learnt quickly (the source may come up later)."""
    live = "://" in source_url and not source_url.startswith("file:")
    target = source_url if live else source_url.removeprefix("file://")
    try:
        options = {"rtsp_transport": "tcp"} if live else {}
        with av.open(target, options=options, timeout=(timeout_s, timeout_s)) as container:
            if not container.streams.video:
                return None
            codec = container.streams.video[0].codec_context
            width, height = int(codec.width), int(codec.height)
    except (av.error.FFmpegError, OSError, ValueError):
        return None
    return (width, height) if width > 0 and height > 0 else None


class Stream:
    def __init__(
        self, *, source_url: str, identity_id: str, source: PreparedSource, pipeline: FramePipeline, metrics: Metrics
    ) -> None:
        self.id = secrets.token_hex(16)
        self.source_url = source_url
        self.identity_id = identity_id
        self.source = source
        self.created = datetime.now(UTC).isoformat(timespec="seconds")
        self.rtsp_path = f"/stream/{self.id}"
        self.rtsp_url: str | None = None
        self.worker: Any = None
        self.publisher: LazyPublisher | None = None
        self._pipeline = pipeline
        self._tracker = pipeline.new_stream()
        self._metrics = metrics
        self.state = "starting"
        self._counters_lock = threading.Lock()
        self._seen_in = 0
        self._seen_dropped = 0

    def process(self, frames: list[Image]) -> list[Image]:
        """Called by the ingest worker's thread with decoded frames; returns the swapped ones."""
        timer = StageTimer()
        self.sync_counters()
        results = self._pipeline.process(frames, self.source, self._tracker, timer, session=f"stream-{self.id}")
        self._metrics.observe_stages(timer)
        self._metrics.frames_out.labels(KIND).inc(len(results))
        return [r.image for r in results]

    def sync_counters(self) -> None:
        """Carry the worker's decoded and dropped frame counts over to the metrics."""
        worker = self.worker
        if worker is None:
            return
        try:
            stats = worker.stats()
        except Exception:  # a stopping worker may not answer; the next call catches up
            return
        frames_in, dropped = int(getattr(stats, "frames_in", 0)), int(getattr(stats, "dropped", 0))
        with self._counters_lock:
            if frames_in > self._seen_in:
                self._metrics.frames_in.labels(KIND).inc(frames_in - self._seen_in)
                self._seen_in = frames_in
            if dropped > self._seen_dropped:
                self._metrics.frames_dropped.labels(KIND, "superseded").inc(dropped - self._seen_dropped)
                self._seen_dropped = dropped

    def on_state(self, state: str) -> None:
        self.state = state

    def switch(self, identity_id: str, source: PreparedSource) -> None:
        self.identity_id = identity_id
        self.source = source

    def stats(self) -> dict[str, Any]:
        worker_stats: dict[str, Any] = {}
        if self.worker is not None:
            try:
                raw = self.worker.stats()
                worker_stats = dict(raw) if isinstance(raw, dict) else dataclasses.asdict(raw)
            except Exception:  # a worker that is stopping may not answer
                worker_stats = {}
        state = getattr(self.worker, "state", None) or self.state
        return {
            "id": self.id,
            "source_url": self.source_url,
            "identity": self.identity_id,
            "state": str(state),
            "created": self.created,
            "rtsp_url": self.rtsp_url,
            "stats": {k: v for k, v in worker_stats.items() if isinstance(v, int | float | str | None)},
        }


class StreamManager:
    def __init__(
        self,
        *,
        pipeline: FramePipeline,
        metrics: Metrics,
        rtsp: RtspOutput,
        max_streams: int,
        worker_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self._metrics = metrics
        self._rtsp = rtsp
        self._max = max_streams
        self._streams: dict[str, Stream] = {}
        self._reserved = 0
        self._accepting = True
        self._worker_factory = worker_factory
        self._unavailable: str | None = None
        if worker_factory is None:
            try:
                self._worker_factory = importlib.import_module("app.media.rtsp_in").IngestWorker
            except Exception as exc:  # RTSP ingest is optional
                self._unavailable = f"RTSP ingest cannot load: {exc}"

    @property
    def unavailable_reason(self) -> str | None:
        if not self._rtsp.available:
            return f"RTSP output is off: {self._rtsp.reason}"
        return self._unavailable

    def __len__(self) -> int:
        return len(self._streams)

    def streams(self) -> list[Stream]:
        return list(self._streams.values())

    def rtsp_paths(self) -> list[str]:
        return [s.rtsp_path for s in self._streams.values()]

    def get(self, stream_id: str) -> Stream:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise StreamNotFound(stream_id)
        return stream

    async def open(self, source_url: str, identity_id: str, source: PreparedSource) -> Stream:
        reason = self.unavailable_reason
        if reason is not None or self._worker_factory is None:
            raise StreamsUnavailable(reason or "RTSP ingest is off")
        if not self._accepting:
            self._metrics.admission_rejections.labels("stream", "shutting_down").inc()
            raise AdmissionError("the server is shutting down")
        if len(self._streams) + self._reserved >= self._max:
            self._metrics.admission_rejections.labels("stream", "capacity").inc()
            raise AdmissionError(f"all {self._max} stream slots are taken")
        self._reserved += 1
        try:
            stream = Stream(
                source_url=source_url,
                identity_id=identity_id,
                source=source,
                pipeline=self.pipeline,
                metrics=self._metrics,
            )
            publisher = stream.publisher = LazyPublisher(self._rtsp, stream.rtsp_path)
            stream.rtsp_url = self._rtsp.url(stream.rtsp_path)
            loop = asyncio.get_running_loop()
            # With the size known the RTSP path exists at once; otherwise it appears with the first frame.
            try:
                size = await loop.run_in_executor(None, probe_size, source_url)
                if size is not None:
                    await loop.run_in_executor(None, publisher.open, *size)
                worker = self._worker_factory(source_url, stream.process, publisher, on_state=stream.on_state)
                stream.worker = worker
                await loop.run_in_executor(None, worker.start)
            except BaseException as exc:
                await asyncio.shield(loop.run_in_executor(None, _stop_stream, stream))
                if isinstance(exc, Exception):
                    raise StreamsUnavailable(f"cannot start the stream: {exc}") from None
                raise
            self._streams[stream.id] = stream
            self._metrics.streams_active.set(len(self._streams))
            return stream
        finally:
            self._reserved -= 1

    async def close(self, stream_id: str) -> None:
        stream = self._streams.pop(stream_id, None)
        if stream is None:
            raise StreamNotFound(stream_id)
        self._metrics.streams_active.set(len(self._streams))
        await asyncio.get_running_loop().run_in_executor(None, _stop_stream, stream)

    async def close_all(self, grace_s: float) -> bool:
        self._accepting = False
        ids = list(self._streams)
        if not ids:
            return True
        closers = [asyncio.ensure_future(self.close(i)) for i in ids]
        _, pending = await asyncio.wait(closers, timeout=grace_s)
        return not pending


def _stop_stream(stream: Stream) -> None:
    try:
        if stream.worker is not None:
            stream.worker.stop()
            stream.sync_counters()
    except Exception:
        log.exception("stream %s: ingest worker did not stop cleanly", stream.id)
    try:
        if stream.publisher is not None:
            stream.publisher.close()
    except Exception:
        log.exception("stream %s: RTSP publisher did not close cleanly", stream.id)
