"""What `swapcast cam` counts: frames sent, received and shown, and how long a frame took from the camera to the
sink (measured through the frame ids stamped in its pixels, app.media.frame_ids)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from app.media.frame_ids import ID_MODULO

LATENCY_WINDOW = 3000  # the newest latencies kept: a long run's percentiles follow its recent minutes


@dataclass
class CamStats:
    sent: int = 0
    received: int = 0
    shown: int = 0
    superseded: int = 0  # received but replaced by a newer frame before the sink took it
    sessions: int = 0
    first_shown_at: float | None = None
    last_shown_at: float | None = None
    latencies_ms: deque[float] = field(default_factory=lambda: deque(maxlen=LATENCY_WINDOW))
    _read_at: dict[int, float] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def note_sent(self, frame_id: int, read_at: float) -> None:
        with self._lock:
            self._read_at[frame_id % ID_MODULO] = read_at
            self.sent += 1

    def note_shown(self, frame_id: int | None, at: float) -> None:
        """A frame handed to the sink at `at`; its latency when its id was read and is one this run sent."""
        with self._lock:
            self.shown += 1
            self.first_shown_at = at if self.first_shown_at is None else self.first_shown_at
            self.last_shown_at = at
            read_at = self._read_at.get(frame_id) if frame_id is not None else None
            if read_at is not None and at >= read_at:
                self.latencies_ms.append((at - read_at) * 1000.0)

    def shown_fps(self) -> float | None:
        if self.first_shown_at is None or self.last_shown_at is None or self.shown < 2:
            return None
        span = self.last_shown_at - self.first_shown_at
        return (self.shown - 1) / span if span > 0 else None

    def percentile_ms(self, q: float) -> float | None:
        with self._lock:
            values = list(self.latencies_ms)
        return float(np.percentile(values, q)) if values else None

    def line(self) -> str:
        fps = self.shown_fps()
        p50, p95 = self.percentile_ms(50), self.percentile_ms(95)
        latency = (
            f"latency p50 {p50:.0f} ms p95 {p95:.0f} ms"
            if p50 is not None and p95 is not None
            else "latency n/a (measured with --measure)"
        )
        return (
            f"sent {self.sent} received {self.received} shown {self.shown} "
            f"({'n/a' if fps is None else f'{fps:.1f}'} fps, {self.superseded} superseded) "
            f"{latency}, sessions {self.sessions}"
        )
