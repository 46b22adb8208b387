"""`LiveCore`: one live stream's processing, shared by WebRTC sessions and RTSP ingest streams.

It owns the per-stream state (the live tracker: detection schedule, background detection, landmark tracking,
face-lost policy), the identity or identity map in use, the stages (the watermark last), hop timing, drop
reasons, counters and stats, and the output fan-out: every processed frame goes to each output listener (the
WebRTC return's track, WHEP viewers, RTSP); a listener that raises is detached, logged and counted, and the
others go on. A transport calls `frame_in` when a decoded frame arrives,
`process` on a worker thread, `finished` with the result, and `frame_out` when an output sent it.
"""

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from app.content.live import ContentGate
from app.errors import UserError
from app.live.counters import LiveCounters
from app.live.frame import OutputFrame
from app.live.hops import HopRecorder
from app.names import FaceLostPolicy
from app.observability import Metrics
from app.pipeline.identity_map import FaceSources, describe_sources
from app.pipeline.mouth import UNAVAILABLE as UNAVAILABLE_MOUTH
from app.pipeline.occlusion import UNAVAILABLE as UNAVAILABLE_OCCLUSION
from app.pipeline.pipeline import FramePipeline
from app.pipeline.timing import StageTimer
from app.pipeline.types import Image
from app.provenance.service import FrameMarker

log = logging.getLogger(__name__)

OutputListener = Callable[[OutputFrame], None]


class LiveCore:
    def __init__(
        self,
        *,
        kind: str,
        name: str,
        identity_id: str,
        source: FaceSources,
        pipeline: FramePipeline,
        metrics: Metrics,
    ) -> None:
        """`kind` labels the metrics (`session`, `stream`); `name` is the stream's key in the pipeline's
        per-stream work (batching fairness)."""
        self.kind = kind
        self.name = name
        self.identity_id = identity_id
        self.source = source
        self.marker: FrameMarker | None = None  # watermark and label of every output frame
        self.content: ContentGate | None = None  # the content gate's schedule and policy (app.content.live)
        self.counters = LiveCounters()
        self.hops = HopRecorder(metrics.hop_seconds, kind)
        # Called with every processed image; each must return at once (they hand the frame to their own
        # encoder or queue). Sessions call them on the event loop, streams on the ingest thread.
        self.output_listeners: list[OutputListener] = []
        self._pipeline = pipeline
        self._metrics = metrics
        self._live = pipeline.new_live_stream()
        self._lock = threading.Lock()  # counters are touched from the transport's and the worker's threads

    def set_options(
        self,
        *,
        on_face_lost: FaceLostPolicy | None = None,
        occlusion: bool | None = None,
        mouth_mask: bool | None = None,
    ) -> None:
        """Change this stream's options given (None: as it is), from the next frame on, all or nothing: a
        UserError, and nothing changed, where one asked for is not available on this server."""
        if occlusion and self._pipeline.hands is None:
            raise UserError(UNAVAILABLE_OCCLUSION)
        if mouth_mask and self._pipeline.mouth_default is None:
            raise UserError(UNAVAILABLE_MOUTH)
        if on_face_lost is not None:
            self.set_face_lost(on_face_lost)
        if occlusion is not None:
            self._live.tracker.occlusion = occlusion
        if mouth_mask is not None:
            self._live.tracker.keep_mouth = mouth_mask

    def options(self) -> dict[str, Any]:
        """This stream's own options (the server's settings are their defaults)."""
        available = self._pipeline.hands is not None
        mouth_default, keep_mouth = self._pipeline.mouth_default, self._live.tracker.keep_mouth
        return {
            "on_face_lost": self.face_lost,
            "occlusion": available and self._live.tracker.occlusion,  # hands kept in front of faces
            "occlusion_available": available,  # the server runs the occlusion stage
            # the target's own mouth kept in the swapped faces
            "mouth_mask": mouth_default is not None and (mouth_default if keep_mouth is None else keep_mouth),
            "mouth_mask_available": mouth_default is not None,  # the server's engine can keep the mouth
        }

    def switch(self, identity_id: str, source: FaceSources) -> None:
        """Use another identity (or map) from the next frame on."""
        self.identity_id = identity_id
        self.source = source

    @property
    def face_lost(self) -> FaceLostPolicy:
        return self._live.tracker.config.on_face_lost

    def set_face_lost(self, policy: FaceLostPolicy) -> None:
        """What this stream does with a swapped face the detector misses, from the next frame on (the server's
        setting is only the default)."""
        tracker = self._live.tracker
        tracker.config = replace(tracker.config, on_face_lost=policy)  # one reference swap: safe for the worker

    def frame_in(self, now: float | None = None, count: int = 1) -> None:
        """`count` decoded frames arrived (a transport that counts in batches passes how many)."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self.counters.frames_in += count
            for _ in range(count):
                self.counters.rate_in.add(now)
        self._metrics.frames_in.labels(self.kind).inc(count)

    def drop(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self.counters.drops[reason] += count
        self._metrics.frames_dropped.labels(self.kind, reason).inc(count)

    def process(self, image: Image, timer: StageTimer) -> Image:
        """Locate, swap and mark one BGR frame (on a worker thread, never the event loop): located without
        waiting for detection where the pipeline detects in the background. Where the content gate is on, the
        input and output go to its check on schedule and the output comes back as its policy has it."""
        gate = self.content
        sampled = gate.sample(image) if gate is not None else None
        result = self._pipeline.process_live(image, self.source, self._live, timer, self.name).image
        if gate is not None:
            with timer.stage("content"):
                result = gate.apply(result, sampled)
        if self.marker is not None:
            with timer.stage("mark"):
                result = self.marker.apply(result)
        return result

    def finished(self, image: Image | OutputFrame, timer: StageTimer) -> OutputFrame:
        """A processed frame: its stage times to the metrics and hops, the frame to every output (one
        `OutputFrame` for all, so its I420 form is converted once); returns that frame."""
        self._metrics.observe_stages(timer)
        self.hops.observe_stages(timer)
        frame = OutputFrame.of(image)
        for listener in list(self.output_listeners):
            try:
                listener(frame)
            except Exception:  # one output's failure must not end the worker, or starve the other outputs
                self._drop_listener(listener)
        return frame

    def _drop_listener(self, listener: OutputListener) -> None:
        """An output listener that raised: removed, logged and counted."""
        with contextlib.suppress(ValueError):
            self.output_listeners.remove(listener)
        with self._lock:
            self.counters.output_errors += 1
        self._metrics.egress_reader_errors.labels(self.kind).inc()
        log.exception("%s %s: an output failed on a frame and was detached", self.kind, self.name)

    def frame_out(self, arrived: float, now: float | None = None) -> None:
        """An output sent the frame that arrived at `arrived`."""
        now = time.monotonic() if now is None else now
        with self._lock:
            counters = self.counters
            counters.frames_out += 1
            counters.rate_out.add(now)
            counters.latencies.append(now - arrived)
        self._metrics.frames_out.labels(self.kind).inc()
        self._metrics.frame_latency.labels(self.kind).observe(now - arrived)

    def stats(self) -> dict[str, Any]:
        """What sessions and streams report alike."""
        now = time.monotonic()
        with self._lock:
            c = self.counters
            counts = {
                "frames_in": c.frames_in,
                "frames_out": c.frames_out,
                "fps_in": round(c.rate_in.rate(now), 1),
                "fps_out": round(c.rate_out.rate(now), 1),
                "latency_ms": c.latency_ms(),
                "drops": dict(c.drops),
                "dropped": sum(c.drops.values()),
                "output_errors": c.output_errors,
            }
        return {
            "identity": self.identity_id,
            **counts,
            "hops_ms": self.hops.summary(),
            # Frames that waited for a detection, by reason, and detections run in the background.
            "detections": dict(self._live.detections),
            "provenance": self.marker.describe() if self.marker else None,
            "identity_map": describe_sources(self.source),
            "options": self.options(),
            "content": self.content.describe() if self.content is not None else None,
        }

    def close(self) -> None:
        self._live.close()
