"""The batcher's queue, without threads or clocks of its own: every call is given `now`.

Per-session FIFO queues served round-robin (a session that floods the queue cannot starve a quiet one),
bounded to `max_items` with one of two policies when full (``reject_newest`` turns the new item away,
``drop_stalest`` pushes out the item that has waited longest), per-item deadlines (an item past its
deadline is never put in a batch), and the rule for when a batch is due. The caller (the batcher's
worker) holds the lock, counts outcomes and completes futures; the queue only reports what happened.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

QueuePolicy = Literal["reject_newest", "drop_stalest"]
POLICIES: tuple[str, ...] = ("reject_newest", "drop_stalest")


class Queued(Protocol):
    """What the queue needs of an item."""

    @property
    def session(self) -> str: ...

    @property
    def deadline(self) -> float | None:
        """Absolute `time.monotonic()` value after which the item is stale, or None."""
        ...

    @property
    def enqueued(self) -> float: ...

    def cancelled(self) -> bool:
        """Whether its caller gave up on it."""
        ...

    def claim(self) -> bool:
        """Mark it as running; False when its caller cancelled it first."""
        ...


E = TypeVar("E", bound=Queued)


@dataclass
class Admission(Generic[E]):
    """What `push` did: `refused` says why the new item was not queued ("expired": its deadline had
    already passed; "full": the queue is full under ``reject_newest``). Items it displaced: `dropped`
    (the stalest, under ``drop_stalest``), `expired` and `cancelled` (purged to make room)."""

    refused: Literal["expired", "full"] | None = None
    dropped: list[E] = field(default_factory=list)
    expired: list[E] = field(default_factory=list)
    cancelled: int = 0


@dataclass
class Taken(Generic[E]):
    """A batch (claimed items, round-robin across sessions), and the dead items skipped while forming it."""

    batch: list[E] = field(default_factory=list)
    expired: list[E] = field(default_factory=list)
    cancelled: int = 0


class FairQueue(Generic[E]):
    """Round-robin across sessions, FIFO within one, at most `max_items` queued in all.

    A batch is due as soon as `max_batch` items wait, when the oldest has waited `max_delay_s`, or when
    every session seen within `active_window_s` already has an item queued (nobody else is coming, so
    waiting would only add latency: a lone stream never waits).
    """

    def __init__(
        self,
        *,
        max_items: int,
        max_batch: int,
        max_delay_s: float,
        policy: QueuePolicy,
        active_window_s: float,
    ) -> None:
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
        self.max_items = max_items
        self.max_batch = max_batch
        self.max_delay_s = max_delay_s
        self.policy = policy
        self.active_window_s = active_window_s
        # A session is in the ring exactly when its queue is non-empty; the front of the ring goes next.
        # Each item is queued with its arrival number, which orders "stalest" across sessions exactly.
        self._queues: dict[str, deque[tuple[int, E]]] = {}
        self._arrivals = 0
        self._ring: deque[str] = deque()
        self._depth = 0
        # A lower bound on the earliest deadline among queued items (inf when none is known).
        self._earliest_deadline = float("inf")
        self._last_seen: dict[str, float] = {}

    @property
    def depth(self) -> int:
        return self._depth

    def seen(self, session: str, now: float) -> None:
        """`session` submitted at `now`: it counts as active for `active_window_s`."""
        self._last_seen[session] = now

    def push(self, item: E, now: float) -> Admission[E]:
        """Queue `item`, or say why not; a full queue is purged of dead items first."""
        admission: Admission[E] = Admission()
        if item.deadline is not None and item.deadline <= now:
            admission.refused = "expired"
            return admission
        if self._depth >= self.max_items:
            self._purge(now, admission)
        if self._depth >= self.max_items:
            if self.policy == "reject_newest":
                admission.refused = "full"
                return admission
            admission.dropped.append(self._pop_stalest())
        queue = self._queues.get(item.session)
        if queue is None:
            queue = self._queues[item.session] = deque()
            self._ring.append(item.session)
        queue.append((self._arrivals, item))
        self._arrivals += 1
        self._depth += 1
        if item.deadline is not None and item.deadline < self._earliest_deadline:
            self._earliest_deadline = item.deadline
        return admission

    def wait_s(self, now: float) -> float | None:
        """How long until a batch is due: None when the queue is empty (wait for an arrival), 0 when due."""
        if self._depth == 0:
            return None
        if self._depth >= self.max_batch or self._everyone_waiting(now):
            return 0.0
        oldest = min(queue[0][1].enqueued for queue in self._queues.values())
        return max(0.0, oldest + self.max_delay_s - now)

    def take(self, now: float) -> Taken[E]:
        """Form a batch of up to `max_batch` items, one per session per round."""
        taken: Taken[E] = Taken()
        while len(taken.batch) < self.max_batch and self._ring:
            session = self._ring.popleft()
            queue = self._queues[session]
            # Skip this session's dead items so that they do not cost it its turn.
            while queue:
                _, item = queue.popleft()
                self._depth -= 1
                if item.deadline is not None and item.deadline <= now:
                    taken.expired.append(item)
                elif not item.claim():
                    taken.cancelled += 1
                else:
                    taken.batch.append(item)
                    break
            if queue:
                self._ring.append(session)
            else:
                del self._queues[session]
        if self._depth == 0:
            self._earliest_deadline = float("inf")
        return taken

    def drain(self) -> list[E]:
        """Remove and return every queued item."""
        items = [item for queue in self._queues.values() for _, item in queue]
        self._queues.clear()
        self._ring.clear()
        self._depth = 0
        self._earliest_deadline = float("inf")
        return items

    def _pop_stalest(self) -> E:
        """Remove and return the item that has waited longest across all sessions."""
        session = min(self._queues, key=lambda s: self._queues[s][0][0])
        queue = self._queues[session]
        _, item = queue.popleft()
        if not queue:
            del self._queues[session]
            self._ring.remove(session)
        self._depth -= 1
        return item

    def alone(self, session: str, now: float) -> bool:
        """Whether nothing is queued and no session but `session` was seen within `active_window_s`: nobody
        else can add to a batch of its items, so they are due the moment they arrive."""
        self._forget_idle(now)
        return self._depth == 0 and all(seen == session for seen in self._last_seen)

    def _everyone_waiting(self, now: float) -> bool:
        self._forget_idle(now)
        return all(session in self._queues for session in self._last_seen)

    def _forget_idle(self, now: float) -> None:
        cutoff = now - self.active_window_s
        for session in [s for s, seen in self._last_seen.items() if seen < cutoff]:
            del self._last_seen[session]

    def _purge(self, now: float, admission: Admission[E]) -> None:
        """Remove expired and cancelled items (only when the queue is full: it costs a full scan)."""
        cancelled = any(queue[0][1].cancelled() for queue in self._queues.values())
        if now < self._earliest_deadline and not cancelled:
            return
        earliest = float("inf")
        for session in list(self._ring):
            queue = self._queues[session]
            keep: deque[tuple[int, E]] = deque()
            for entry in queue:
                item = entry[1]
                if item.cancelled():
                    admission.cancelled += 1
                elif item.deadline is not None and item.deadline <= now:
                    admission.expired.append(item)
                else:
                    keep.append(entry)
                    if item.deadline is not None and item.deadline < earliest:
                        earliest = item.deadline
            self._depth -= len(queue) - len(keep)
            if keep:
                self._queues[session] = keep
            else:
                del self._queues[session]
                self._ring.remove(session)
        self._earliest_deadline = earliest
