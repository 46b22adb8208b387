"""`DynamicBatcher`: callers on any thread hand it items; one worker thread forms batches from its
`FairQueue` and calls `run_batch` once per batch, so calls for one model are serialised and never run
on an event loop. A caller that blocks for its results anyway (`run`) and is alone runs its batch on its
own thread: handing it to the worker and back would only add two thread wake-ups."""

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
    order. It is called one call at a time: on this batcher's worker thread, or on the thread of a lone
    caller of the blocking `run` (never from `submit`, `submit_many` or `submit_async`).

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
        # The thread inside run_batch (the worker, or a lone caller of `run`), None between batches.
        self._running_on: threading.Thread | None = None
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
        """The inference thread that calls `run_batch` for every item but a lone `run` caller's."""
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

    def run(self, items: Sequence[T], *, session: str, deadline: float | None = None) -> list[R]:
        """Blocking: the results of `items`, as `submit_many` and waiting on every future would give them
        (raising the first failure). When nothing is queued or running and no other session was active
        within the queue's active window, nobody could join the batch: it runs at once on this thread.
        """
        now = time.monotonic()
        if deadline is None and self._default_deadline_s is not None:
            deadline = now + self._default_deadline_s
        with self._cond:
            inline = (
                not self._closed
                and self._running_on is None
                and 0 < len(items) <= self._queue.max_batch
                and (deadline is None or deadline > now)
                and self._queue.alone(session, now)
            )
            if inline:
                self._queue.seen(session, now)
                self._metrics.submitted.inc(len(items))
                self._running_on = threading.current_thread()
        if not inline:
            return [future.result() for future in self.submit_many(items, session=session, deadline=deadline)]
        values = list(items)
        for _ in values:
            self._metrics.queue_wait.observe(0.0)
        results, error = self._compute(values)
        if error is not None:
            raise error
        return results

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
        me = threading.current_thread()
        if me is self._worker:
            return False
        until = None if timeout is None else time.monotonic() + timeout
        self._worker.join(timeout)
        with self._cond:  # a lone caller's batch, running on its own thread, finishes too
            if self._running_on is me:
                return False
            left = None if until is None else max(0.0, until - time.monotonic())
            idle = self._cond.wait_for(lambda: self._running_on is None, left)
        return idle and not self._worker.is_alive()

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
                if self._running_on is not None:  # a lone caller's batch: one run_batch at a time
                    self._cond.wait()
                    continue
                now = time.monotonic()
                wait = self._queue.wait_s(now)
                if wait is None or wait > 0:
                    self._cond.wait(wait)
                    continue
                taken = self._queue.take(now)
                if taken.batch:
                    self._running_on = self._worker
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
        formed = time.monotonic()
        for it in batch:
            self._metrics.queue_wait.observe(formed - it.enqueued)
        results, error = self._compute([it.value for it in batch])
        if error is None:
            for it, result in zip(batch, results, strict=True):
                it.future.set_result(result)
        else:
            for it in batch:
                it.future.set_exception(error)
            if not isinstance(error, Exception):
                raise error

    def _compute(self, values: list[T]) -> tuple[list[R], BaseException | None]:
        """`run_batch` on `values` by the thread that claimed `_running_on`, timed and counted; it releases
        the claim. The results, or the error that stands for all of them."""
        m = self._metrics
        error: BaseException | None = None
        results: list[R] = []
        start = time.monotonic()
        try:
            results = list(self._run_batch(values))
            if len(results) != len(values):
                error = errors.BatchResultError(
                    f"run_batch of batcher {self._name} returned {len(results)} results "
                    f"for a batch of {len(values)} items"
                )
        except BaseException as exc:
            error = exc
        m.compute.observe(time.monotonic() - start)

        with self._cond:
            m.batch_size.observe(len(values))
            (m.completed if error is None else m.failed).inc(len(values))
            self._running_on = None
            self._cond.notify_all()  # the worker (items queued meanwhile) and a closer waiting for the batch
        if error is not None and not isinstance(error, errors.BatcherError):
            log.warning("batcher %s: run_batch failed on %d items: %r", self._name, len(values), error)
        return results, error
