"""DynamicBatcher: batching, delay bound, queue policies, deadlines, fairness, shutdown, async, metrics."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from app.runtime.batcher import (
    BatcherClosedError,
    BatchResultError,
    DroppedError,
    DynamicBatcher,
    ExpiredError,
    QueueFullError,
)

WAIT = 10.0  # generous bound for anything that should happen "soon"
BLOCK = "block"


def has_block(items: list[Any]) -> bool:
    return any(isinstance(x, str) and x == BLOCK for x in items)


class Recorder:
    """A run_batch that records each batch and holds the batch containing BLOCK until released."""

    def __init__(self, fn: Callable[[Any], Any] = lambda x: ("out", x)) -> None:
        self.fn = fn
        self.batches: list[list[Any]] = []
        self.threads: set[threading.Thread] = set()
        self.blocked = threading.Event()
        self.release = threading.Event()

    def __call__(self, items: list[Any]) -> list[Any]:
        self.batches.append(list(items))
        self.threads.add(threading.current_thread())
        if has_block(items):
            self.blocked.set()
            assert self.release.wait(WAIT), "test never released the blocked batch"
        return [self.fn(x) for x in items]

    def seen(self) -> list[Any]:
        return [x for batch in self.batches for x in batch]


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def make(registry: CollectorRegistry) -> Iterator[Callable[..., DynamicBatcher[Any, Any]]]:
    made: list[DynamicBatcher[Any, Any]] = []

    def factory(run_batch: Callable[[list[Any]], Sequence[Any]], **kw: Any) -> DynamicBatcher[Any, Any]:
        kw.setdefault("name", "test")
        kw.setdefault("max_batch", 8)
        kw.setdefault("max_delay_ms", 5)
        kw.setdefault("max_queue", 1000)
        b: DynamicBatcher[Any, Any] = DynamicBatcher(run_batch=run_batch, registry=registry, **kw)
        made.append(b)
        return b

    yield factory
    for b in made:
        assert b.close(timeout=WAIT)
        assert not b.worker.is_alive()


def block_worker(b: DynamicBatcher[Any, Any], rec: Recorder, session: str = "blocker") -> Future[Any]:
    """Occupy the worker with a batch that waits for rec.release, so that later items stay queued."""
    fut = b.submit(BLOCK, session=session)
    assert rec.blocked.wait(WAIT)
    return fut


def metric(registry: CollectorRegistry, name: str, batcher: str = "test") -> float:
    value = registry.get_sample_value(name, {"batcher": batcher})
    assert value is not None, f"no sample {name} for batcher {batcher}"
    return value


def test_batch_results_equal_per_item_results(make: Callable[..., DynamicBatcher[Any, Any]]) -> None:
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((16, 8)).astype(np.float32)

    def model(batch: np.ndarray) -> np.ndarray:
        return np.tanh(batch @ weights) * 3.0 + 1.0

    rec = Recorder()

    def run_batch(items: list[Any]) -> list[Any]:
        rec(items)
        if has_block(items):
            return [None] * len(items)
        return list(model(np.stack(items)))

    b = make(run_batch, max_batch=16, max_delay_ms=20)
    blocker = block_worker(b, rec)
    inputs = [rng.standard_normal(16).astype(np.float32) for _ in range(120)]
    futures = [b.submit(x, session=f"s{i % 3}") for i, x in enumerate(inputs)]
    rec.release.set()

    for x, fut in zip(inputs, futures, strict=True):
        np.testing.assert_allclose(fut.result(WAIT), model(x[None])[0], rtol=1e-5, atol=1e-6)
    assert blocker.result(WAIT) is None
    # Everything queued while the worker was busy, so the batches after the blocker are full.
    assert [len(batch) for batch in rec.batches] == [1, 16, 16, 16, 16, 16, 16, 16, 8]
    assert rec.threads == {b.worker}
    assert b.worker is not threading.main_thread()
    stats = b.stats()
    assert (stats.submitted, stats.completed, stats.batches) == (121, 121, 9)
    assert stats.mean_batch_size == pytest.approx(121 / 9)


def test_full_batch_runs_without_waiting_for_the_delay(make: Callable[..., DynamicBatcher[Any, Any]]) -> None:
    rec = Recorder()
    b = make(rec, max_batch=8, max_delay_ms=60_000)
    start = time.monotonic()
    futures = b.submit_many(list(range(8)), session="s")
    # A 60 s delay would make result(WAIT) time out if the full batch waited for it.
    assert [f.result(WAIT) for f in futures] == [("out", i) for i in range(8)]
    assert time.monotonic() - start < WAIT
    assert rec.batches == [list(range(8))]


def test_lone_item_waits_about_max_delay_while_another_session_is_active(
    make: Callable[..., DynamicBatcher[Any, Any]],
) -> None:
    rec = Recorder()
    b = make(rec, max_batch=64, max_delay_ms=100)
    b.submit_many(["a0"], session="a")[0].result(WAIT)
    b.submit("b0", session="b").result(WAIT)
    # Session a is active but has nothing queued: b's next item waits for a's, up to the delay.
    start = time.monotonic()
    fut = b.submit("x", session="b")
    assert fut.result(WAIT) == ("out", "x")
    elapsed = time.monotonic() - start
    assert elapsed >= 0.099  # never before the delay is up
    assert elapsed < 2.0  # and not long after it
    assert rec.batches[-1] == ["x"]


def test_a_lone_session_never_waits_for_the_delay(make: Callable[..., DynamicBatcher[Any, Any]]) -> None:
    rec = Recorder()
    b = make(rec, max_batch=64, max_delay_ms=60_000)
    futures = b.submit_many(["f0", "f1", "f2"], session="only")
    # Nobody else is active: the batch runs at once instead of after 60 s, with all three faces.
    assert [f.result(WAIT) for f in futures] == [("out", "f0"), ("out", "f1"), ("out", "f2")]
    assert rec.batches == [["f0", "f1", "f2"]]


def test_a_batch_runs_once_every_active_session_has_submitted(
    make: Callable[..., DynamicBatcher[Any, Any]],
) -> None:
    rec = Recorder()
    b = make(rec, max_batch=64, max_delay_ms=60_000)
    b.submit_many([], session="a")  # a and b become active
    b.submit_many([], session="b")
    first = b.submit("a1", session="a")
    time.sleep(0.2)
    assert not first.done()  # b is active and may submit soon: wait for it
    second = b.submit("b1", session="b")
    assert first.result(WAIT) == ("out", "a1") and second.result(WAIT) == ("out", "b1")
    assert rec.batches == [["a1", "b1"]]


def test_reject_newest_fails_the_new_item_and_counts_it(
    make: Callable[..., DynamicBatcher[Any, Any]], registry: CollectorRegistry
) -> None:
    rec = Recorder()
    b = make(rec, max_queue=4, policy="reject_newest")
    block_worker(b, rec)
    queued = [b.submit(i, session=f"s{i % 2}") for i in range(4)]
    assert b.queue_depth == 4
    rejected = b.submit(99, session="s0")
    assert rejected.done()
    with pytest.raises(QueueFullError, match="queue is full"):
        rejected.result(0)
    assert b.queue_depth == 4
    rec.release.set()
    assert [f.result(WAIT) for f in queued] == [("out", i) for i in range(4)]
    assert 99 not in rec.seen()
    assert b.stats().rejected == 1
    assert metric(registry, "swapcast_batcher_rejected_total") == 1


def test_drop_stalest_fails_the_oldest_item_and_admits_the_new_one(
    make: Callable[..., DynamicBatcher[Any, Any]], registry: CollectorRegistry
) -> None:
    rec = Recorder()
    b = make(rec, max_queue=3, policy="drop_stalest")
    block_worker(b, rec)
    a = b.submit("a", session="s1")
    bb = b.submit("b", session="s2")
    c = b.submit("c", session="s1")
    d = b.submit("d", session="s2")  # pushes out a, the oldest overall
    with pytest.raises(DroppedError):
        a.result(0)
    assert not bb.done()
    e = b.submit("e", session="s1")  # pushes out b, now the oldest
    with pytest.raises(DroppedError):
        bb.result(0)
    assert b.queue_depth == 3
    rec.release.set()
    assert [f.result(WAIT) for f in (c, d, e)] == [("out", "c"), ("out", "d"), ("out", "e")]
    assert set(rec.seen()) == {BLOCK, "c", "d", "e"}
    assert b.stats().dropped == 2
    assert metric(registry, "swapcast_batcher_dropped_total") == 2


def test_expired_items_are_failed_and_never_computed(
    make: Callable[..., DynamicBatcher[Any, Any]], registry: CollectorRegistry
) -> None:
    rec = Recorder()
    b = make(rec, max_queue=2, policy="reject_newest", default_deadline_s=0.05)
    block_worker(b, rec)
    stale = b.submit("stale", session="s1")  # gets the default 50 ms deadline
    fresh = b.submit("fresh", session="s2", deadline=time.monotonic() + 60)
    late = b.submit("late", session="s1", deadline=time.monotonic() - 1)
    with pytest.raises(ExpiredError):
        late.result(0)
    # Wait (monotonic) until the default deadline has certainly passed.
    deadline = time.monotonic() + 0.05
    while time.monotonic() <= deadline + 0.01:
        time.sleep(0.01)
    # The queue is full, but the expired item makes room instead of the new one being rejected.
    newer = b.submit("newer", session="s1", deadline=time.monotonic() + 60)
    with pytest.raises(ExpiredError):
        stale.result(0)
    rec.release.set()
    assert fresh.result(WAIT) == ("out", "fresh")
    assert newer.result(WAIT) == ("out", "newer")
    assert "stale" not in rec.seen() and "late" not in rec.seen()
    assert b.stats().expired == 2
    assert b.stats().rejected == 0
    assert metric(registry, "swapcast_batcher_expired_total") == 2


def test_deadline_passing_in_the_queue_expires_at_batch_formation(
    make: Callable[..., DynamicBatcher[Any, Any]],
) -> None:
    rec = Recorder()
    b = make(rec, max_batch=4)
    block_worker(b, rec)
    soon = time.monotonic() + 0.03
    doomed = [b.submit(f"d{i}", session="s", deadline=soon) for i in range(3)]
    kept = b.submit("k", session="s")
    while time.monotonic() <= soon + 0.01:
        time.sleep(0.01)
    rec.release.set()
    assert kept.result(WAIT) == ("out", "k")
    for f in doomed:
        with pytest.raises(ExpiredError, match="deadline passed"):
            f.result(WAIT)
    assert rec.batches[1:] == [["k"]]


def test_round_robin_keeps_a_quiet_session_from_starving(make: Callable[..., DynamicBatcher[Any, Any]]) -> None:
    rec = Recorder()
    b = make(rec, max_batch=4, max_delay_ms=5, max_queue=1000)
    block_worker(b, rec, session="flood")
    flood = [b.submit(("flood", i), session="flood") for i in range(200)]
    quiet = [b.submit(("quiet", i), session="quiet") for i in range(5)]
    rec.release.set()
    assert [f.result(WAIT) for f in quiet] == [("out", ("quiet", i)) for i in range(5)]
    for f in flood:
        f.result(WAIT)

    batches_with_quiet = [n for n, batch in enumerate(rec.batches) if any(x[0] == "quiet" for x in batch)]
    # Batch 0 is the blocker; the quiet session alternates with the flood from batch 1 on.
    assert batches_with_quiet == [1, 2, 3]
    assert rec.batches[1] == [("flood", 0), ("quiet", 0), ("flood", 1), ("quiet", 1)]
    # Each session is still served in its own FIFO order.
    seen = rec.seen()[1:]
    assert [x for x in seen if x[0] == "flood"] == [("flood", i) for i in range(200)]
    assert [x for x in seen if x[0] == "quiet"] == [("quiet", i) for i in range(5)]


def test_close_fails_pending_items_finishes_the_running_batch_and_joins(
    make: Callable[..., DynamicBatcher[Any, Any]],
) -> None:
    rec = Recorder()
    b = make(rec, name="cl")
    running = block_worker(b, rec)
    pending = [b.submit(i, session="s") for i in range(3)]

    closed: list[bool] = []
    closer = threading.Thread(target=lambda: closed.append(b.close(timeout=WAIT)))
    closer.start()
    for f in pending:
        with pytest.raises(BatcherClosedError, match=r"^batcher cl is shut down$"):
            f.result(WAIT)
    assert not running.done()  # the in-flight batch is allowed to finish

    rec.release.set()
    closer.join(WAIT)
    assert closed == [True]
    assert running.result(0) == ("out", BLOCK)
    assert not b.worker.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "batcher-cl"]

    with pytest.raises(BatcherClosedError, match="shut down"):
        b.submit("late", session="s").result(0)
    assert b.close(timeout=WAIT)  # idempotent
    stats = b.stats()
    assert (stats.failed, stats.rejected, stats.completed) == (3, 1, 1)
    assert rec.seen() == [BLOCK]


def test_context_manager_closes(registry: CollectorRegistry) -> None:
    with DynamicBatcher[int, int](
        "ctx", lambda xs: [x * 2 for x in xs], max_batch=4, max_delay_ms=1, max_queue=8, registry=registry
    ) as b:
        assert b.submit(21, session="s").result(WAIT) == 42
    assert b.closed
    assert not b.worker.is_alive()


def test_run_batch_exception_fails_the_whole_batch_and_the_worker_survives(
    make: Callable[..., DynamicBatcher[Any, Any]], registry: CollectorRegistry
) -> None:
    def run_batch(items: list[str]) -> list[str]:
        if "bad" in items:
            raise ValueError("boom")
        return [x.upper() for x in items]

    b = make(run_batch, max_batch=3, max_delay_ms=60_000)
    first = [b.submit(x, session=s) for x, s in (("ok1", "a"), ("bad", "b"), ("ok2", "a"))]
    for f in first:
        with pytest.raises(ValueError, match="boom"):
            f.result(WAIT)
    second = [b.submit(x, session="a") for x in ("x", "y", "z")]
    assert [f.result(WAIT) for f in second] == ["X", "Y", "Z"]
    assert b.stats().failed == 3
    assert metric(registry, "swapcast_batcher_failed_total") == 3
    assert metric(registry, "swapcast_batcher_completed_total") == 3


def test_wrong_number_of_results_is_a_clear_error(make: Callable[..., DynamicBatcher[Any, Any]]) -> None:
    def run_batch(items: list[Any]) -> list[Any]:
        return items[:-1] if items[0] == "short" else items

    b = make(run_batch, max_batch=3, max_delay_ms=60_000)
    futures = [b.submit(x, session="s") for x in ("short", 1, 2)]
    for f in futures:
        with pytest.raises(BatchResultError, match="returned 2 results for a batch of 3 items"):
            f.result(WAIT)
    # The worker is still serving.
    again = [b.submit(x, session="s") for x in (3, 4, 5)]
    assert [f.result(WAIT) for f in again] == [3, 4, 5]
    assert (b.stats().failed, b.stats().completed) == (3, 3)


def test_submit_async_keeps_the_event_loop_responsive(make: Callable[..., DynamicBatcher[Any, Any]]) -> None:
    def slow(items: list[int]) -> list[int]:
        time.sleep(0.3)
        return [x * x for x in items]

    b = make(slow, max_batch=8, max_delay_ms=5)

    async def main() -> tuple[list[int], int]:
        ticks = 0
        stop = asyncio.Event()

        async def heartbeat() -> None:
            nonlocal ticks
            while not stop.is_set():
                await asyncio.sleep(0.01)
                ticks += 1

        beat = asyncio.create_task(heartbeat())
        results = await asyncio.gather(*(b.submit_async(i, session=f"s{i % 2}") for i in range(6)))
        during = ticks
        stop.set()
        await beat
        return list(results), during

    results, ticks = asyncio.run(main())
    assert results == [i * i for i in range(6)]
    # About 30 ticks fit in the 0.3 s batch; a blocked loop would manage none.
    assert ticks >= 5


def test_cancelled_async_item_is_not_computed(make: Callable[..., DynamicBatcher[Any, Any]]) -> None:
    rec = Recorder()
    b = make(rec)
    block_worker(b, rec)

    async def main() -> None:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(b.submit_async("gone", session="s"), 0.05)

    asyncio.run(main())
    after = b.submit("after", session="s")
    rec.release.set()
    assert after.result(WAIT) == ("out", "after")
    assert "gone" not in rec.seen()
    assert b.stats().cancelled == 1


def test_metrics_read_back_from_the_registry(
    make: Callable[..., DynamicBatcher[Any, Any]], registry: CollectorRegistry
) -> None:
    rec = Recorder()
    b = make(rec, name="swap", max_batch=4, max_queue=5)
    other = make(lambda xs: xs, name="det", max_batch=1)
    assert other.submit(1, session="s").result(WAIT) == 1

    block_worker(b, rec)
    queued = [b.submit(i, session="s") for i in range(5)]
    assert metric(registry, "swapcast_batcher_queue_depth", "swap") == 5
    b.submit(5, session="s")  # rejected: the queue holds 5
    rec.release.set()
    for f in queued:
        f.result(WAIT)

    assert metric(registry, "swapcast_batcher_queue_depth", "swap") == 0
    assert metric(registry, "swapcast_batcher_submitted_total", "swap") == 7
    assert metric(registry, "swapcast_batcher_completed_total", "swap") == 6
    assert metric(registry, "swapcast_batcher_rejected_total", "swap") == 1
    # Batches: [block], [0, 1, 2, 3], [4].
    assert metric(registry, "swapcast_batcher_batch_size_count", "swap") == 3
    assert metric(registry, "swapcast_batcher_batch_size_sum", "swap") == 6
    assert metric(registry, "swapcast_batcher_compute_seconds_count", "swap") == 3
    assert metric(registry, "swapcast_batcher_queue_wait_seconds_count", "swap") == 6
    assert metric(registry, "swapcast_batcher_queue_wait_seconds_sum", "swap") > 0
    # The other batcher's children are separate.
    assert metric(registry, "swapcast_batcher_completed_total", "det") == 1
    assert b.stats().mean_batch_size == pytest.approx(2.0)


def test_invalid_settings_are_refused(registry: CollectorRegistry) -> None:
    def ident(xs: list[int]) -> list[int]:
        return xs

    with pytest.raises(ValueError, match="max_batch"):
        DynamicBatcher("v", ident, max_batch=0, max_delay_ms=1, max_queue=1, registry=registry)
    with pytest.raises(ValueError, match="policy"):
        DynamicBatcher(
            "v",
            ident,
            max_batch=1,
            max_delay_ms=1,
            max_queue=1,
            policy="lifo",  # type: ignore[arg-type]
            registry=registry,
        )


def test_default_registry_holds_several_batchers() -> None:
    from prometheus_client import REGISTRY

    def double(xs: list[int]) -> list[int]:
        return [2 * x for x in xs]

    first = DynamicBatcher("default-reg-a", double, max_batch=1, max_delay_ms=1, max_queue=4)
    second = DynamicBatcher("default-reg-b", double, max_batch=1, max_delay_ms=1, max_queue=4)
    try:
        assert first.submit(1, session="s").result(WAIT) == 2
        assert second.submit(2, session="s").result(WAIT) == 4
        for name in ("default-reg-a", "default-reg-b"):
            assert REGISTRY.get_sample_value("swapcast_batcher_completed_total", {"batcher": name}) == 1
    finally:
        assert first.close(WAIT) and second.close(WAIT)


def test_a_lone_blocking_caller_runs_its_batch_on_its_own_thread_with_no_hand_off(
    make: Callable[..., DynamicBatcher[Any, Any]],
) -> None:
    rec = Recorder()
    b = make(rec, max_batch=8, max_delay_ms=60_000)
    assert b.run(["f0", "f1"], session="only") == [("out", "f0"), ("out", "f1")]
    assert b.run(["f2"], session="only") == [("out", "f2")]
    # Neither batch was handed to the worker: the caller would only have waited for it.
    assert rec.threads == {threading.current_thread()}
    assert rec.batches == [["f0", "f1"], ["f2"]]
    stats = b.stats()
    assert (stats.submitted, stats.completed, stats.batches) == (3, 3, 2)


def test_a_blocking_caller_goes_through_the_worker_while_another_session_is_active(
    make: Callable[..., DynamicBatcher[Any, Any]],
) -> None:
    rec = Recorder()
    b = make(rec, max_batch=8, max_delay_ms=60_000)
    blocker = block_worker(b, rec)  # session "blocker" is active and its batch is running
    got: list[list[Any]] = []
    caller = threading.Thread(target=lambda: got.append(b.run(["x"], session="s")))
    caller.start()
    deadline = time.monotonic() + WAIT
    while b.queue_depth == 0:  # queued behind the running batch, not run beside it
        assert time.monotonic() < deadline, "the item was never queued"
        time.sleep(0.001)
    submit_during = b.submit("y", session="blocker")
    rec.release.set()
    caller.join(WAIT)
    assert got == [[("out", "x")]]
    assert blocker.result(WAIT) == ("out", BLOCK) and submit_during.result(WAIT) == ("out", "y")
    assert rec.threads == {b.worker}
    assert rec.batches == [[BLOCK], ["x", "y"]]  # batched together, round-robin across the two sessions


def test_items_submitted_during_a_lone_callers_batch_wait_for_it_and_close_waits_for_it_too(
    make: Callable[..., DynamicBatcher[Any, Any]],
) -> None:
    rec = Recorder()
    b = make(rec, max_batch=8, max_delay_ms=0)
    got: list[list[Any]] = []
    caller = threading.Thread(target=lambda: got.append(b.run([BLOCK], session="only")))
    caller.start()
    assert rec.blocked.wait(WAIT)
    later = b.submit("later", session="other")
    closed: list[bool] = []
    closer = threading.Thread(target=lambda: closed.append(b.close(timeout=WAIT)))
    closer.start()
    with pytest.raises(BatcherClosedError):  # queued while the lone batch ran: never run beside it
        later.result(WAIT)
    assert closed == []  # close is still waiting for the lone caller's batch
    rec.release.set()
    caller.join(WAIT)
    closer.join(WAIT)
    assert got == [[("out", BLOCK)]] and closed == [True]
    assert rec.batches == [[BLOCK]]
    stats = b.stats()
    assert stats.submitted == stats.completed + stats.failed == 2
