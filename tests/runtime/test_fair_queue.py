"""FairQueue on its own, without threads or clocks: every call is given `now`."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from app.runtime.batcher import FairQueue, QueuePolicy


@dataclass
class Job:
    session: str
    n: int
    enqueued: float = 0.0
    deadline: float | None = None
    gave_up: bool = False
    running: bool = False

    def cancelled(self) -> bool:
        return self.gave_up

    def claim(self) -> bool:
        if self.gave_up:
            return False
        self.running = True
        return True


def queue(
    *, max_items: int = 100, max_batch: int = 4, max_delay_s: float = 0.01, policy: QueuePolicy = "drop_stalest"
) -> FairQueue[Job]:
    return FairQueue(
        max_items=max_items, max_batch=max_batch, max_delay_s=max_delay_s, policy=policy, active_window_s=1.0
    )


def names(jobs: list[Job]) -> list[tuple[str, int]]:
    return [(j.session, j.n) for j in jobs]


def test_batches_are_round_robin_across_sessions_and_fifo_within_one() -> None:
    q = queue(max_batch=4)
    for n in range(5):
        assert q.push(Job("flood", n), 0.0).refused is None
    for n in range(2):
        q.push(Job("quiet", n), 0.0)
    first = q.take(0.0)
    assert names(first.batch) == [("flood", 0), ("quiet", 0), ("flood", 1), ("quiet", 1)]
    assert all(j.running for j in first.batch)
    assert names(q.take(0.0).batch) == [("flood", 2), ("flood", 3), ("flood", 4)]
    assert q.depth == 0


def test_a_batch_is_due_when_full_when_the_oldest_waited_the_delay_or_when_everyone_is_waiting() -> None:
    q = queue(max_batch=3, max_delay_s=0.010)
    assert q.wait_s(0.0) is None  # empty: wait for an arrival
    q.seen("a", 0.0)
    q.seen("b", 0.0)
    q.push(Job("a", 0, enqueued=0.0), 0.0)
    assert q.wait_s(0.004) == pytest.approx(0.006)  # b is active and has nothing queued yet
    assert q.wait_s(0.011) == 0.0  # the oldest waited the delay
    q.push(Job("b", 0, enqueued=0.005), 0.005)
    assert q.wait_s(0.005) == 0.0  # every active session has an item queued
    q.take(0.005)
    q.seen("c", 0.006)
    for n in range(3):
        q.push(Job("a", n, enqueued=0.006), 0.006)
    assert q.wait_s(0.006) == 0.0  # max_batch items wait


def test_a_session_idle_for_the_active_window_no_longer_holds_a_batch_back() -> None:
    q = queue(max_batch=8, max_delay_s=0.5)
    q.seen("gone", 0.0)
    q.seen("live", 2.0)
    q.push(Job("live", 0, enqueued=2.0), 2.0)
    assert q.wait_s(2.0) == 0.0  # "gone" last submitted 2 s ago, beyond the 1 s window


def test_reject_newest_refuses_the_new_item_when_full() -> None:
    q = queue(max_items=2, policy="reject_newest")
    q.push(Job("a", 0), 0.0)
    q.push(Job("a", 1), 0.0)
    admission = q.push(Job("b", 0), 0.0)
    assert admission.refused == "full" and not admission.dropped
    assert names(q.take(0.0).batch) == [("a", 0), ("a", 1)]


def test_drop_stalest_pushes_out_the_longest_waiting_item_across_sessions() -> None:
    q = queue(max_items=2, policy="drop_stalest")
    q.push(Job("b", 0), 0.0)
    q.push(Job("a", 0), 0.0)  # same clock reading: arrival order decides which is stalest
    admission = q.push(Job("c", 0), 0.0)
    assert admission.refused is None and names(admission.dropped) == [("b", 0)]
    assert q.depth == 2
    assert names(q.take(0.0).batch) == [("a", 0), ("c", 0)]


def test_an_item_past_its_deadline_is_refused_at_push_and_skipped_at_take() -> None:
    q = queue()
    assert q.push(Job("a", 0, deadline=1.0), 1.0).refused == "expired"
    q.push(Job("a", 1, deadline=2.0), 1.0)
    q.push(Job("a", 2, deadline=9.0), 1.0)
    q.push(Job("b", 0), 1.0)
    taken = q.take(3.0)
    assert names(taken.expired) == [("a", 1)]
    # The dead item did not cost session a its turn.
    assert names(taken.batch) == [("a", 2), ("b", 0)]


def test_a_full_queue_purges_dead_items_before_applying_its_policy() -> None:
    q = queue(max_items=3, policy="reject_newest")
    q.push(Job("a", 0, deadline=2.0), 0.0)
    cancelled = Job("b", 0)
    q.push(cancelled, 0.0)
    q.push(Job("c", 0), 0.0)
    cancelled.gave_up = True
    admission = q.push(Job("d", 0), 5.0)
    assert admission.refused is None
    assert names(admission.expired) == [("a", 0)] and admission.cancelled == 1
    assert q.depth == 2
    assert names(q.take(5.0).batch) == [("c", 0), ("d", 0)]


def test_cancelled_items_are_counted_at_take_and_never_claimed() -> None:
    q = queue()
    gone = Job("a", 0)
    q.push(gone, 0.0)
    q.push(Job("a", 1), 0.0)
    gone.gave_up = True
    taken = q.take(0.0)
    assert taken.cancelled == 1 and names(taken.batch) == [("a", 1)] and not gone.running


def test_drain_empties_the_queue() -> None:
    q = queue()
    for n in range(3):
        q.push(Job(f"s{n}", n), 0.0)
    assert sorted(names(q.drain())) == [("s0", 0), ("s1", 1), ("s2", 2)]
    assert q.depth == 0 and q.wait_s(0.0) is None and not q.take(0.0).batch


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="policy must be one of"):
        queue(policy="lifo")  # type: ignore[arg-type]


def test_a_session_is_alone_only_with_nothing_queued_and_no_other_session_active_within_the_window() -> None:
    q = queue()
    assert q.alone("a", 0.0)  # nobody seen yet
    q.seen("a", 0.0)
    assert q.alone("a", 0.5)
    q.seen("b", 0.4)
    assert not q.alone("a", 0.5) and not q.alone("b", 0.5)  # each may join the other's batch
    assert q.alone("a", 1.5)  # b was last seen more than the active window (1 s) ago
    q.push(Job("a", 0), 1.5)
    assert not q.alone("a", 1.5)  # something is queued: the worker serves it first
