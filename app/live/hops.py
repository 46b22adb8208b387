"""Where a live frame's time goes, hop by hop, per stream and as Prometheus histograms.

Hops of a live frame, each measured on the server's monotonic clock from the moment the transport hands over
the decoded frame:

- `queue`: decoded → taken by a pipeline worker (waiting for a thread, or behind the previous frame);
- one hop per pipeline stage (`convert_in`, `detect`, `track`, `align`, `swap`, `paste`, `convert_out`, ...);
- `output_wait`: processed → taken by the encoder (aiortc asks at its own pace);
- `encode`: the video encoder's own run (`app.media.hops` times aiortc's encoder);
- `total`: decoded → encoded, ready for the network (for RTSP ingest: decoded → handed to the RTSP encoder).

aiortc does not say when a frame's packets arrived from the network, so the first hop starts at "decoded".
"""

import threading
from collections import deque

import numpy as np
from prometheus_client import Histogram

from app.pipeline.timing import StageTimer

HOP_WINDOW = 300  # frames each stream's summary covers (10 s at 30 fps)


class HopRecorder:
    """One session's recent hop durations (thread-safe: the worker and encoder threads record too)."""

    def __init__(self, histogram: Histogram | None = None, kind: str = "session") -> None:
        self._histogram = histogram
        self._kind = kind
        self._hops: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def observe(self, hop: str, seconds: float) -> None:
        with self._lock:
            self._hops.setdefault(hop, deque(maxlen=HOP_WINDOW)).append(seconds)
        if self._histogram is not None:
            self._histogram.labels(self._kind, hop).observe(seconds)

    def observe_stages(self, timer: StageTimer) -> None:
        for stage, values in timer.samples.items():
            for seconds in values:
                self.observe(stage, seconds)

    def summary(self) -> dict[str, dict[str, float]]:
        """hop -> p50 and p95 in milliseconds over the recent frames, in the order hops were first seen."""
        with self._lock:
            samples = {hop: np.asarray(values, np.float64) * 1000.0 for hop, values in self._hops.items() if values}
        return {
            hop: {"p50": round(float(np.percentile(v, 50)), 1), "p95": round(float(np.percentile(v, 95)), 1)}
            for hop, v in samples.items()
        }
