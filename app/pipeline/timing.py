"""Per-stage wall-clock timings, collected by the pipeline for benchmarks and metrics."""

import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np


class StageTimer:
    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)
        self._clock = clock

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = self._clock()
        try:
            yield
        finally:
            self.samples[name].append(self._clock() - start)

    def add(self, name: str, seconds: float) -> None:
        self.samples[name].append(seconds)

    def summary(self) -> dict[str, dict[str, float]]:
        """p50/p99/mean in milliseconds per stage."""
        return {name: percentiles_ms(values) for name, values in self.samples.items()}


def percentiles_ms(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    ms = np.asarray(values) * 1000.0
    return {
        "n": len(values),
        "p50": round(float(np.percentile(ms, 50)), 3),
        "p99": round(float(np.percentile(ms, 99)), 3),
        "mean": round(float(ms.mean()), 3),
    }


def call_times(call: Callable[[], object], runs: int, clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Seconds of `runs` calls of `call`, one after another, by `clock` (default: the wall clock)."""
    times = []
    for _ in range(runs):
        start = clock()
        call()
        times.append(clock() - start)
    return times
