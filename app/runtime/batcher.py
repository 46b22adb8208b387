"""A dynamic batcher: many callers' small model calls become few large ones.

Each model (detector, swapper, enhancer) gets one `DynamicBatcher`. Callers on any thread, or on an
event loop, hand it single items; a single worker thread owned by the batcher collects them into
batches and calls `run_batch` once per batch. Because there is exactly one worker per batcher, model
calls for one model are serialised and never run on the event loop.

A batch is formed as soon as `max_batch` items wait, or when the oldest waiting item has waited
`max_delay_ms`, or when every session active in the last second already has an item waiting (nobody
else is coming, so waiting would only add latency). Items are taken round-robin across sessions (FIFO
within a session), so a session that floods the queue cannot starve a quiet one.

Every outcome is delivered through the returned future: a result, or one of the `BatcherError`
subclasses below, or whatever `run_batch` raised.

Counters kept (in `stats()` and in Prometheus, labelled ``batcher=<name>``):

* ``submitted``: every call to `submit` (and `submit_async`);
* ``completed``: items that got a result;
* ``failed``: items whose batch raised or returned the wrong number of results, and items still
  queued when the batcher was closed;
* ``rejected``: items turned away at submit (queue full under ``reject_newest``, or batcher closed);
* ``dropped``: queued items pushed out by newer ones under ``drop_stalest``;
* ``expired``: items whose deadline passed before they were put in a batch;
* ``cancelled``: items whose future was cancelled while they were queued.

Once the queue is empty and nothing is in flight, ``submitted`` equals the sum of the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from app.runtime.metric_families import families_for

__all__ = [
    "BatchResultError",
    "BatcherClosedError",
    "BatcherError",
    "BatcherStats",
    "DroppedError",
    "DynamicBatcher",
    "ExpiredError",
    "QueuePolicy",
    "QueueFullError",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")

QueuePolicy = Literal["reject_newest", "drop_stalest"]
_POLICIES: tuple[str, ...] = ("reject_newest", "drop_stalest")


class BatcherError(Exception):
    """Base class of the errors a batcher itself puts on an item's future."""


class QueueFullError(BatcherError):
    """The queue was full and the policy is ``reject_newest``: the new item was not admitted."""


class DroppedError(BatcherError):
    """The queue was full and the policy is ``drop_stalest``: this (oldest) item made room for a newer one."""


class ExpiredError(BatcherError):
    """The item's deadline passed before it was put in a batch; it was never computed."""


class BatcherClosedError(BatcherError):
    """The batcher is shut down: the item was submitted after `close`, or was still queued at `close`."""


class BatchResultError(BatcherError):
    """`run_batch` returned a result list whose length differs from the batch it was given."""


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


class _MetricFamilies:
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


class _Metrics:
    """One batcher's labelled children of the shared metric families."""

    def __init__(self, registry: CollectorRegistry | None, name: str) -> None:
        f = families_for(registry, _MetricFamilies)
        self.batch_size = f.batch_size.labels(name)
        self.queue_wait = f.queue_wait.labels(name)
        self.compute = f.compute.labels(name)
        self.queue_depth = f.queue_depth.labels(name)
        self.submitted = f.submitted.labels(name)
        self.completed = f.completed.labels(name)
        self.failed = f.failed.labels(name)
        self.rejected = f.rejected.labels(name)
        self.dropped = f.dropped.labels(name)
        self.expired = f.expired.labels(name)
        self.cancelled = f.cancelled.labels(name)


class _Item(Generic[T, R]):
    __slots__ = ("deadline", "enqueued", "future", "seq", "session", "value")

    def __init__(
        self, value: T, session: str, deadline: float | None, enqueued: float, seq: int, future: Future[R]
    ) -> None:
        self.value = value
        self.session = session
        self.deadline = deadline
        self.enqueued = enqueued
        self.seq = seq
        self.future = future


def _fail(future: Future[Any], exc: BaseException) -> None:
    """Put `exc` on `future` unless its caller cancelled it meanwhile."""
    with contextlib.suppress(InvalidStateError):
        future.set_exception(exc)


class DynamicBatcher(Generic[T, R]):
    """Collects single items from many sessions into batches for one model.

    `run_batch` receives a list of items and must return a list of results of the same length and
    order. It is only ever called on this batcher's worker thread, one call at a time.

    `default_deadline_s`, when given, is the time budget (seconds from submit) of items submitted
    without an explicit deadline. Explicit deadlines are absolute `time.monotonic()` values.
    """

    def __init__(
        self,
        name: str,
        run_batch: Callable[[list[T]], Sequence[R]],
        *,
        max_batch: int,
        max_delay_ms: float,
        max_queue: int,
        policy: QueuePolicy = "reject_newest",
        default_deadline_s: float | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        if max_delay_ms < 0:
            raise ValueError(f"max_delay_ms must not be negative, got {max_delay_ms}")
        if max_queue < 1:
            raise ValueError(f"max_queue must be at least 1, got {max_queue}")
        if policy not in _POLICIES:
            raise ValueError(f"policy must be one of {', '.join(_POLICIES)}, got {policy!r}")
        if default_deadline_s is not None and default_deadline_s <= 0:
            raise ValueError(f"default_deadline_s must be positive, got {default_deadline_s}")

        self._name = name
        self._run_batch = run_batch
        self._max_batch = max_batch
        self._max_delay_s = max_delay_ms / 1000.0
        self._max_queue = max_queue
        self._policy = policy
        self._default_deadline_s = default_deadline_s
        self._metrics = _Metrics(registry, name)

        self._cond = threading.Condition(threading.Lock())
        # Per-session FIFO queues, and the ring of sessions that have something queued: a session is
        # in the ring exactly when its queue is non-empty; the front of the ring is served next.
        self._queues: dict[str, deque[_Item[T, R]]] = {}
        self._ring: deque[str] = deque()
        self._depth = 0
        self._seq = 0
        # A lower bound on the earliest deadline among queued items (inf when none is known).
        self._earliest_deadline = float("inf")
        self._closed = False
        # When each session last submitted: sessions seen within the window count as active.
        self._last_seen: dict[str, float] = {}
        self._active_window_s = max(1.0, 20 * self._max_delay_s)

        self._submitted = 0
        self._completed = 0
        self._failed = 0
        self._rejected = 0
        self._dropped = 0
        self._expired = 0
        self._cancelled = 0
        self._batches = 0
        self._batched_items = 0

        self._metrics.queue_depth.set(0)
        self._worker = threading.Thread(target=self._work, name=f"batcher-{name}", daemon=True)
        self._worker.start()

    # ----------------------------------------------------------------- public

    @property
    def name(self) -> str:
        return self._name

    @property
    def closed(self) -> bool:
        with self._cond:
            return self._closed

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return self._depth

    @property
    def worker(self) -> threading.Thread:
        """The inference thread that calls `run_batch`."""
        return self._worker

    def submit(self, item: T, *, session: str, deadline: float | None = None) -> Future[R]:
        """Queue `item` for `session`; returns at once with a future for its result.

        Never blocks on the model. All outcomes (result, `QueueFullError`, `DroppedError`,
        `ExpiredError`, `BatcherClosedError`, a `run_batch` error) arrive through the future.
        """
        return self.submit_many([item], session=session, deadline=deadline)[0]

    def submit_many(self, items: Sequence[T], *, session: str, deadline: float | None = None) -> list[Future[R]]:
        """Queue several items of one session at once (e.g. every face of a frame), so that the worker
        sees them together and never starts a batch with only the first of them."""
        futures: list[Future[R]] = [Future() for _ in items]
        now = time.monotonic()
        if deadline is None and self._default_deadline_s is not None:
            deadline = now + self._default_deadline_s
        self._metrics.submitted.inc(len(futures))
        failures: list[tuple[Future[Any], BaseException]] = []
        with self._cond:
            self._last_seen[session] = now
            for item, future in zip(items, futures, strict=True):
                self._submitted += 1
                refusal = self._admit_locked(item, session, deadline, now, future, failures)
                if refusal is not None:
                    failures.append((future, refusal))
            self._metrics.queue_depth.set(self._depth)
        for fut, exc in failures:
            _fail(fut, exc)
        return futures

    async def submit_async(self, item: T, *, session: str, deadline: float | None = None) -> R:
        """Like `submit`, awaited on the running event loop; the loop never blocks on the model.

        Cancelling the awaiting task cancels the item if it is still queued.
        """
        return await asyncio.wrap_future(self.submit(item, session=session, deadline=deadline))

    def stats(self) -> BatcherStats:
        with self._cond:
            return BatcherStats(
                submitted=self._submitted,
                completed=self._completed,
                failed=self._failed,
                rejected=self._rejected,
                dropped=self._dropped,
                expired=self._expired,
                cancelled=self._cancelled,
                batches=self._batches,
                batched_items=self._batched_items,
                queue_depth=self._depth,
            )

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting items, fail queued ones, let the running batch finish, join the worker.

        Queued items fail with ``BatcherClosedError("batcher <name> is shut down")``. Returns True
        when the worker thread has ended, False if `timeout` ran out first (or when called from
        `run_batch` itself, where the worker cannot be joined). Calling it again is harmless.
        """
        with self._cond:
            pending = self._drain_locked() if not self._closed else []
            self._closed = True
            self._failed += len(pending)
            self._metrics.queue_depth.set(0)
            self._cond.notify_all()
        if pending:
            self._metrics.failed.inc(len(pending))
        for it in pending:
            _fail(it.future, self._closed_error())
        if threading.current_thread() is self._worker:
            return False
        self._worker.join(timeout)
        return not self._worker.is_alive()

    def __enter__(self) -> DynamicBatcher[T, R]:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"DynamicBatcher(name={self._name!r}, max_batch={self._max_batch}, "
            f"max_delay_ms={self._max_delay_s * 1000:g}, max_queue={self._max_queue}, "
            f"policy={self._policy!r})"
        )

    # ------------------------------------------------------- queue (locked)

    def _closed_error(self) -> BatcherClosedError:
        return BatcherClosedError(f"batcher {self._name} is shut down")

    def _admit_locked(
        self,
        item: T,
        session: str,
        deadline: float | None,
        now: float,
        future: Future[R],
        failures: list[tuple[Future[Any], BaseException]],
    ) -> BatcherError | None:
        """Queue a new item, or return the error refusing it; items it displaces go to `failures`."""
        m = self._metrics
        if self._closed:
            self._rejected += 1
            m.rejected.inc()
            return self._closed_error()
        if deadline is not None and deadline <= now:
            self._expired += 1
            m.expired.inc()
            return ExpiredError(f"deadline passed before submit to batcher {self._name}")
        if self._depth >= self._max_queue:
            failures.extend(self._purge_locked(now))
        if self._depth >= self._max_queue:
            if self._policy == "reject_newest":
                self._rejected += 1
                m.rejected.inc()
                return QueueFullError(f"batcher {self._name} queue is full ({self._max_queue} items)")
            victim = self._pop_oldest_locked()
            self._dropped += 1
            m.dropped.inc()
            failures.append(
                (
                    victim.future,
                    DroppedError(
                        f"batcher {self._name} queue is full: dropped the oldest item "
                        f"(session {victim.session}) for a newer one"
                    ),
                )
            )
        self._enqueue_locked(_Item(item, session, deadline, now, self._seq, future))
        self._seq += 1
        # The worker re-checks whether a batch is due whenever something arrives.
        self._cond.notify()
        return None

    def _enqueue_locked(self, it: _Item[T, R]) -> None:
        q = self._queues.get(it.session)
        if q is None:
            q = self._queues[it.session] = deque()
            self._ring.append(it.session)
        q.append(it)
        self._depth += 1
        if it.deadline is not None and it.deadline < self._earliest_deadline:
            self._earliest_deadline = it.deadline

    def _pop_oldest_locked(self) -> _Item[T, R]:
        """Remove and return the item that has waited longest across all sessions."""
        session = min(self._queues, key=lambda s: self._queues[s][0].seq)
        q = self._queues[session]
        it = q.popleft()
        if not q:
            del self._queues[session]
            self._ring.remove(session)
        self._depth -= 1
        return it

    def _everyone_waiting_locked(self, now: float) -> bool:
        """True when every recently active session already has work queued. Nobody else is about to
        submit, so waiting out the delay would only add latency (a lone stream never waits)."""
        cutoff = now - self._active_window_s
        for session in [s for s, seen in self._last_seen.items() if seen < cutoff]:
            del self._last_seen[session]
        return all(session in self._queues for session in self._last_seen)

    def _oldest_enqueued_locked(self) -> float:
        return min(q[0].enqueued for q in self._queues.values())

    def _purge_locked(self, now: float) -> list[tuple[Future[Any], BaseException]]:
        """Remove expired and cancelled items (done only when the queue is full)."""
        cancelled = any(q[0].future.cancelled() for q in self._queues.values())
        if now < self._earliest_deadline and not cancelled:
            return []
        failures: list[tuple[Future[Any], BaseException]] = []
        earliest = float("inf")
        for session in list(self._ring):
            q = self._queues[session]
            keep: deque[_Item[T, R]] = deque()
            for it in q:
                if it.future.cancelled():
                    self._cancelled += 1
                    self._metrics.cancelled.inc()
                elif it.deadline is not None and it.deadline <= now:
                    self._expired += 1
                    self._metrics.expired.inc()
                    failures.append((it.future, self._expired_error()))
                else:
                    keep.append(it)
                    if it.deadline is not None and it.deadline < earliest:
                        earliest = it.deadline
            self._depth -= len(q) - len(keep)
            if keep:
                self._queues[session] = keep
            else:
                del self._queues[session]
                self._ring.remove(session)
        self._earliest_deadline = earliest
        return failures

    def _drain_locked(self) -> list[_Item[T, R]]:
        items = [it for q in self._queues.values() for it in q]
        self._queues.clear()
        self._ring.clear()
        self._depth = 0
        self._earliest_deadline = float("inf")
        return items

    def _expired_error(self) -> ExpiredError:
        return ExpiredError(f"deadline passed while queued in batcher {self._name}")

    def _take_locked(self, now: float) -> tuple[list[_Item[T, R]], list[_Item[T, R]]]:
        """Form a batch round-robin over sessions; returns (batch, expired items)."""
        batch: list[_Item[T, R]] = []
        expired: list[_Item[T, R]] = []
        while len(batch) < self._max_batch and self._ring:
            session = self._ring.popleft()
            q = self._queues[session]
            # Skip this session's dead items so that they do not cost it its turn.
            while q:
                it = q.popleft()
                self._depth -= 1
                if it.deadline is not None and it.deadline <= now:
                    expired.append(it)
                elif not it.future.set_running_or_notify_cancel():
                    self._cancelled += 1
                    self._metrics.cancelled.inc()
                else:
                    batch.append(it)
                    break
            if q:
                self._ring.append(session)
            else:
                del self._queues[session]
        if self._depth == 0:
            self._earliest_deadline = float("inf")
        self._expired += len(expired)
        return batch, expired

    # ----------------------------------------------------------------- worker

    def _next_batch(self) -> tuple[list[_Item[T, R]], list[_Item[T, R]]] | None:
        """Wait until a batch is due and take it; None once the batcher is closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._depth == 0:
                    self._cond.wait()
                    continue
                now = time.monotonic()
                if self._depth < self._max_batch and not self._everyone_waiting_locked(now):
                    remaining = self._oldest_enqueued_locked() + self._max_delay_s - now
                    if remaining > 0:
                        self._cond.wait(remaining)
                        continue
                taken = self._take_locked(now)
                self._metrics.queue_depth.set(self._depth)
                return taken

    def _work(self) -> None:
        try:
            while True:
                taken = self._next_batch()
                if taken is None:
                    return
                batch, expired = taken
                if expired:
                    self._metrics.expired.inc(len(expired))
                    for it in expired:
                        _fail(it.future, self._expired_error())
                if batch:
                    self._execute(batch)
        except BaseException:
            log.exception("batcher %s: worker thread died", self._name)
            raise
        finally:
            # Normally a no-op (close got here first); after an unexpected worker death this makes
            # sure nobody waits forever on a queue that no thread serves.
            self.close(timeout=0)

    def _execute(self, batch: list[_Item[T, R]]) -> None:
        m = self._metrics
        formed = time.monotonic()
        m.batch_size.observe(len(batch))
        for it in batch:
            m.queue_wait.observe(formed - it.enqueued)

        error: BaseException | None = None
        results: list[R] = []
        start = time.monotonic()
        try:
            results = list(self._run_batch([it.value for it in batch]))
            if len(results) != len(batch):
                error = BatchResultError(
                    f"run_batch of batcher {self._name} returned {len(results)} results "
                    f"for a batch of {len(batch)} items"
                )
        except BaseException as exc:
            error = exc
        m.compute.observe(time.monotonic() - start)

        with self._cond:
            self._batches += 1
            self._batched_items += len(batch)
            if error is None:
                self._completed += len(batch)
            else:
                self._failed += len(batch)
        if error is None:
            m.completed.inc(len(batch))
            for it, result in zip(batch, results, strict=True):
                it.future.set_result(result)
        else:
            m.failed.inc(len(batch))
            if not isinstance(error, BatcherError):
                log.warning("batcher %s: run_batch failed on %d items: %r", self._name, len(batch), error)
            for it in batch:
                it.future.set_exception(error)
            if not isinstance(error, Exception):
                raise error
