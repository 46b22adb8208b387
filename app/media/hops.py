"""Where a live frame's time goes, hop by hop, per session and as Prometheus histograms.

Hops of a WebRTC frame, each measured on the server's monotonic clock from the moment aiortc hands over the
decoded frame:

- `queue`: decoded → taken by a pipeline worker (waiting for a thread, or behind the previous frame);
- one hop per pipeline stage (`convert_in`, `detect`, `track`, `align`, `swap`, `paste`, `convert_out`, ...);
- `output_wait`: processed → taken by the encoder (aiortc asks at its own pace);
- `encode`: the video encoder's own run;
- `total`: decoded → encoded, ready for the network.

aiortc does not say when a frame's packets arrived from the network, so the first hop starts at "decoded".
The encoder is timed by wrapping aiortc's encoder factory (`install_timed_encoders`): a frame that carries an
`EncodeCallback` in `frame.opaque` reports its encode start and end to it; other frames pass untouched.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np
from prometheus_client import Histogram

from app.pipeline.timing import StageTimer

EncodeCallback = Callable[[float, float], None]  # (encode started, encode ended), monotonic seconds
HOP_WINDOW = 300  # frames each session's summary covers (10 s at 30 fps)


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


class TimedEncoder:
    """An aiortc encoder that reports how long each of our frames took to encode."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def encode(self, frame: Any, force_keyframe: bool = False) -> Any:
        started = time.monotonic()
        result = self._inner.encode(frame, force_keyframe)
        callback = getattr(frame, "opaque", None)
        if callable(callback):
            callback(started, time.monotonic())
        return result

    @property
    def target_bitrate(self) -> int:
        return int(self._inner.target_bitrate)

    @target_bitrate.setter
    def target_bitrate(self, bitrate: int) -> None:
        self._inner.target_bitrate = bitrate

    def __getattr__(self, name: str) -> Any:  # pack(), and anything a later aiortc adds
        return getattr(self._inner, name)


_installed = False
_install_lock = threading.Lock()


def install_timed_encoders() -> None:
    """Make aiortc's senders in this process use swapcast's encoders (app.media.encoder) wrapped in
    `TimedEncoder`s (idempotent). Frames without an `EncodeCallback` are encoded exactly as before."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from aiortc import rtcrtpsender

        from app.media.encoder import create_encoder

        def get_encoder(codec: Any) -> Any:
            encoder = create_encoder(codec)
            return TimedEncoder(encoder) if codec.mimeType.lower().startswith("video/") else encoder

        rtcrtpsender.get_encoder = get_encoder
        _installed = True
