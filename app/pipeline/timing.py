"""Per-stage wall-clock timings, collected by the pipeline for benchmarks and metrics."""

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np


class StageTimer:
    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = defaultdict(list)

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.samples[name].append(time.perf_counter() - start)

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
