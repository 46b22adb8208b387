"""A batcher's metrics, labelled ``batcher=<name>``. Each count has one source, its Prometheus child:
`BatcherStats` is read back from the children, and the queue-depth gauge reads the queue itself.

Batchers that share a name in one registry share their children (so their counts add up)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.runtime.metric_families import families_for


@dataclass(frozen=True)
class BatcherStats:
    """A snapshot of a batcher's counters, for benchmarks and debugging."""

    submitted: int
    completed: int
    failed: int
    rejected: int
    dropped: int
    expired: int
    cancelled: int
    batches: int
    batched_items: int
    queue_depth: int

    @property
    def mean_batch_size(self) -> float:
        """Mean number of items per `run_batch` call (0.0 before the first batch)."""
        return self.batched_items / self.batches if self.batches else 0.0


_BATCH_SIZE_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)
_SECONDS_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.02,
    0.035,
    0.05,
    0.075,
    0.1,
    0.15,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)


class _Families:
    """The batcher metric families of one registry; each batcher uses the children for its name."""

    def __init__(self, registry: CollectorRegistry) -> None:
        label = ["batcher"]
        self.batch_size = Histogram(
            "swapcast_batcher_batch_size",
            "Items per run_batch call.",
            label,
            buckets=_BATCH_SIZE_BUCKETS,
            registry=registry,
        )
        self.queue_wait = Histogram(
            "swapcast_batcher_queue_wait_seconds",
            "Time an item waited in the queue before its batch was formed.",
            label,
            buckets=_SECONDS_BUCKETS,
            registry=registry,
        )
        self.compute = Histogram(
            "swapcast_batcher_compute_seconds",
            "Wall time of one run_batch call.",
            label,
            buckets=_SECONDS_BUCKETS,
            registry=registry,
        )
        self.queue_depth = Gauge(
            "swapcast_batcher_queue_depth",
            "Items waiting in the queue.",
            label,
            registry=registry,
        )

        def counter(what: str, doc: str) -> Counter:
            return Counter(f"swapcast_batcher_{what}", doc, label, registry=registry)

        self.submitted = counter("submitted", "Items handed to submit.")
        self.completed = counter("completed", "Items that got a result.")
        self.failed = counter("failed", "Items failed by a run_batch error or by shutdown.")
        self.rejected = counter("rejected", "Items turned away at submit (queue full or closed).")
        self.dropped = counter("dropped", "Queued items pushed out by newer ones (drop_stalest).")
        self.expired = counter("expired", "Items whose deadline passed before batching.")
        self.cancelled = counter("cancelled", "Items cancelled by their caller while queued.")


def _sample(metric: Counter | Histogram, suffix: str) -> int:
    """One sample of a labelled child (e.g. ``_total`` of a counter, ``_count`` of a histogram)."""
    for family in metric.collect():
        for sample in family.samples:
            if sample.name.endswith(suffix):
                return int(sample.value)
    raise LookupError(f"no {suffix} sample")  # prometheus-client always exports these


class BatcherMetrics:
    """One batcher's labelled children of the shared metric families. Counters are only incremented
    under the batcher's lock, so a `stats` read under that lock is a consistent snapshot."""

    def __init__(self, registry: CollectorRegistry | None, name: str, queue_depth: Callable[[], int]) -> None:
        f = families_for(registry, _Families)
        self.batch_size = f.batch_size.labels(name)
        self.queue_wait = f.queue_wait.labels(name)
        self.compute = f.compute.labels(name)
        self.queue_depth = f.queue_depth.labels(name)
        self.queue_depth.set_function(queue_depth)
        self.submitted = f.submitted.labels(name)
        self.completed = f.completed.labels(name)
        self.failed = f.failed.labels(name)
        self.rejected = f.rejected.labels(name)
        self.dropped = f.dropped.labels(name)
        self.expired = f.expired.labels(name)
        self.cancelled = f.cancelled.labels(name)
        self._depth = queue_depth

    def stats(self) -> BatcherStats:
        return BatcherStats(
            submitted=_sample(self.submitted, "_total"),
            completed=_sample(self.completed, "_total"),
            failed=_sample(self.failed, "_total"),
            rejected=_sample(self.rejected, "_total"),
            dropped=_sample(self.dropped, "_total"),
            expired=_sample(self.expired, "_total"),
            cancelled=_sample(self.cancelled, "_total"),
            batches=_sample(self.batch_size, "_count"),
            batched_items=_sample(self.batch_size, "_sum"),
            queue_depth=self._depth(),
        )
