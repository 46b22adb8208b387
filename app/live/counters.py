"""What a live stream counts: frames in and out, drops by reason, recent latencies and rates."""

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class RateWindow:
    """Events per second over the last `seconds`."""

    def __init__(self, seconds: float = 2.0) -> None:
        self.seconds = seconds
        self._times: deque[float] = deque()

    def add(self, now: float) -> None:
        self._times.append(now)
        self._trim(now)

    def rate(self, now: float) -> float:
        self._trim(now)
        if len(self._times) < 2:
            return 0.0
        return len(self._times) / self.seconds

    def _trim(self, now: float) -> None:
        while self._times and self._times[0] < now - self.seconds:
            self._times.popleft()


@dataclass
class LiveCounters:
    frames_in: int = 0
    frames_out: int = 0
    drops: Counter[str] = field(default_factory=Counter)
    output_errors: int = 0  # output listeners detached because they raised
    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=300))
    rate_in: RateWindow = field(default_factory=RateWindow)
    rate_out: RateWindow = field(default_factory=RateWindow)

    def latency_ms(self) -> dict[str, Any]:
        """p50 and p95 of the recent frames' latency, in milliseconds (None before the first frame)."""
        latencies = np.asarray(self.latencies, dtype=np.float64) * 1000.0
        if not latencies.size:
            return {"p50": None, "p95": None}
        return {
            "p50": round(float(np.percentile(latencies, 50)), 1),
            "p95": round(float(np.percentile(latencies, 95)), 1),
        }
