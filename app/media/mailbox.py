"""A one-item mailbox: keep only the newest item, count every item it replaces or loses, with the reason.

Between the network and the pipeline only the newest frame is worth processing: a queue would build
latency without limit whenever processing is slower than arrival. Every hand-over point (camera to
worker, worker to encoder) is one of these.

Thread-safe: `put`, `take` and `discard` hold the mailbox's condition, which the owner may share with
its own state (pass `cond`) so that waiting for "an item, or anything else that changed" is one wait.
A `put` notifies that condition; with `wakes_loop=True` it also sets an asyncio event for a task that
awaits `wait_async` (such puts, and `wake`, must run on that event loop's thread).
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")

SUPERSEDED = "superseded"

DropListener = Callable[[str, int], None]


class Mailbox(Generic[T]):
    def __init__(
        self,
        *,
        cond: threading.Condition | None = None,
        on_drop: DropListener | None = None,
        wakes_loop: bool = False,
    ) -> None:
        self.cond = cond if cond is not None else threading.Condition()
        self.drops: Counter[str] = Counter()
        self._on_drop = on_drop
        self._item: T | None = None
        self._has_item = False
        self._event = asyncio.Event() if wakes_loop else None

    @property
    def has_item(self) -> bool:
        return self._has_item

    @property
    def dropped(self) -> int:
        """Items lost, for every reason."""
        with self.cond:
            return sum(self.drops.values())

    def put(self, item: T, reason: str = SUPERSEDED) -> bool:
        """Hold `item`; an item still waiting is dropped for `reason`. True when one was replaced."""
        with self.cond:
            replaced = self._has_item
            self._item, self._has_item = item, True
            if replaced:
                self._count(reason, 1)
            self.cond.notify_all()
        if self._event is not None:
            self._event.set()
        return replaced

    def take(self) -> T | None:
        """The waiting item (None when there is none); the mailbox is empty afterwards."""
        with self.cond:
            item, self._item, self._has_item = self._item, None, False
            return item

    def discard(self, reason: str | None = None) -> None:
        """Empty the mailbox; the item is counted as dropped only when a `reason` is given."""
        with self.cond:
            if self._has_item and reason is not None:
                self._count(reason, 1)
            self._item, self._has_item = None, False

    def count_drop(self, reason: str, count: int = 1) -> None:
        """Count items lost after they left the mailbox (a full encoder queue, a failed step, ...)."""
        with self.cond:
            self._count(reason, count)

    async def wait_async(self) -> None:
        """Return once a `put` (or `wake`) happened since the previous return."""
        if self._event is None:
            raise RuntimeError("this mailbox was made without wakes_loop=True")
        await self._event.wait()
        self._event.clear()

    def wake(self) -> None:
        """Wake whoever waits, without an item (to let it see that it should stop)."""
        with self.cond:
            self.cond.notify_all()
        if self._event is not None:
            self._event.set()

    def _count(self, reason: str, count: int) -> None:
        self.drops[reason] += count
        if self._on_drop is not None:
            self._on_drop(reason, count)
