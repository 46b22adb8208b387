"""`DynamicBatcher`: callers on any thread hand it items; one worker thread forms batches from its
`FairQueue` and calls `run_batch` once per batch, so calls for one model are serialised and never run
on an event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, TypeVar

from prometheus_client import CollectorRegistry

from app.runtime.batcher import errors
from app.runtime.batcher.fair_queue import POLICIES, Admission, FairQueue, QueuePolicy
from app.runtime.batcher.metrics import BatcherMetrics, BatcherStats

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


@dataclass(slots=True, eq=False)  # eq=False: items stay hashable and compare by identity
class _Item(Generic[T, R]):
    """One submitted item with the future its caller waits on."""

    value: T
    session: str
    deadline: float | None
    enqueued: float
    future: Future[R]

    def cancelled(self) -> bool:
        return self.future.cancelled()

    def claim(self) -> bool:
        return self.future.set_running_or_notify_cancel()


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
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        if default_deadline_s is not None and default_deadline_s <= 0:
            raise ValueError(f"default_deadline_s must be positive, got {default_deadline_s}")

        self._name = name
        self._run_batch = run_batch
        self._default_deadline_s = default_deadline_s
        max_delay_s = max_delay_ms / 1000.0
        self._queue: FairQueue[_Item[T, R]] = FairQueue(
            max_items=max_queue,
            max_batch=max_batch,
            max_delay_s=max_delay_s,
            policy=policy,
            active_window_s=max(1.0, 20 * max_delay_s),
        )
        self._cond = threading.Condition(threading.Lock())
        self._closed = False
        self._metrics = BatcherMetrics(registry, name, lambda: self._queue.depth)
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
            return self._queue.depth

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
        failures: list[tuple[Future[Any], BaseException]] = []
        with self._cond:
            self._queue.seen(session, now)
            self._metrics.submitted.inc(len(futures))
            for value, future in zip(items, futures, strict=True):
                refusal = self._admit_locked(_Item(value, session, deadline, now, future), now, failures)
                if refusal is not None:
                    failures.append((future, refusal))
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
            return self._metrics.stats()

    def close(self, timeout: float | None = None) -> bool:
        """Stop accepting items, fail queued ones, let the running batch finish, join the worker.

        Queued items fail with ``BatcherClosedError("batcher <name> is shut down")``. Returns True
        when the worker thread has ended, False if `timeout` ran out first (or when called from
        `run_batch` itself, where the worker cannot be joined). Calling it again is harmless.
        """
        with self._cond:
            pending = self._queue.drain() if not self._closed else []
            self._closed = True
            if pending:
                self._metrics.failed.inc(len(pending))
            self._cond.notify_all()
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
        q = self._queue
        return (
            f"DynamicBatcher(name={self._name!r}, max_batch={q.max_batch}, "
            f"max_delay_ms={q.max_delay_s * 1000:g}, max_queue={q.max_items}, policy={q.policy!r})"
        )

    # ------------------------------------------------------- queue (locked)

    def _closed_error(self) -> errors.BatcherClosedError:
        return errors.BatcherClosedError(f"batcher {self._name} is shut down")

    def _expired_error(self) -> errors.ExpiredError:
        return errors.ExpiredError(f"deadline passed while queued in batcher {self._name}")

    def _admit_locked(
        self, item: _Item[T, R], now: float, failures: list[tuple[Future[Any], BaseException]]
    ) -> errors.BatcherError | None:
        """Queue a new item, or return the error refusing it; items it displaces go to `failures`."""
        m = self._metrics
        if self._closed:
            m.rejected.inc()
            return self._closed_error()
        admission: Admission[_Item[T, R]] = self._queue.push(item, now)
        if admission.cancelled:
            m.cancelled.inc(admission.cancelled)
        if admission.expired:
            m.expired.inc(len(admission.expired))
            failures.extend((it.future, self._expired_error()) for it in admission.expired)
        for victim in admission.dropped:
            m.dropped.inc()
            failures.append(
                (
                    victim.future,
                    errors.DroppedError(
                        f"batcher {self._name} queue is full: dropped the oldest item "
                        f"(session {victim.session}) for a newer one"
                    ),
                )
            )
        if admission.refused == "expired":
            m.expired.inc()
            return errors.ExpiredError(f"deadline passed before submit to batcher {self._name}")
        if admission.refused == "full":
            m.rejected.inc()
            return errors.QueueFullError(f"batcher {self._name} queue is full ({self._queue.max_items} items)")
        # The worker re-checks whether a batch is due whenever something arrives.
        self._cond.notify()
        return None

    # ----------------------------------------------------------------- worker

    def _next_batch(self) -> tuple[list[_Item[T, R]], list[_Item[T, R]]] | None:
        """Wait until a batch is due and take it; None once the batcher is closed."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                now = time.monotonic()
                wait = self._queue.wait_s(now)
                if wait is None or wait > 0:
                    self._cond.wait(wait)
                    continue
                taken = self._queue.take(now)
                m = self._metrics
                if taken.cancelled:
                    m.cancelled.inc(taken.cancelled)
                if taken.expired:
                    m.expired.inc(len(taken.expired))
                return taken.batch, taken.expired

    def _work(self) -> None:
        try:
            while True:
                taken = self._next_batch()
                if taken is None:
                    return
                batch, expired = taken
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
        for it in batch:
            m.queue_wait.observe(formed - it.enqueued)

        error: BaseException | None = None
        results: list[R] = []
        start = time.monotonic()
        try:
            results = list(self._run_batch([it.value for it in batch]))
            if len(results) != len(batch):
                error = errors.BatchResultError(
                    f"run_batch of batcher {self._name} returned {len(results)} results "
                    f"for a batch of {len(batch)} items"
                )
        except BaseException as exc:
            error = exc
        m.compute.observe(time.monotonic() - start)

        with self._cond:
            m.batch_size.observe(len(batch))
            (m.completed if error is None else m.failed).inc(len(batch))
        if error is None:
            for it, result in zip(batch, results, strict=True):
                it.future.set_result(result)
        else:
            if not isinstance(error, errors.BatcherError):
                log.warning("batcher %s: run_batch failed on %d items: %r", self._name, len(batch), error)
            for it in batch:
                it.future.set_exception(error)
            if not isinstance(error, Exception):
                raise error
