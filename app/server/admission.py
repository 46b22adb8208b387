"""Admission, one for sessions and one for streams: what is open, against a capacity, and refusal at shutdown.

A slot is reserved while an item opens (negotiation, probing a source), so concurrent requests cannot
overshoot the capacity; every refusal is counted by resource kind and reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Generic, TypeVar

from prometheus_client import Gauge

from app.observability import Metrics

T = TypeVar("T")


class AdmissionError(Exception):
    """No room for another session or stream (answered with 503 and Retry-After: `retry_after_s` when a slot is
    known to free by then, else the configured default)."""

    def __init__(self, message: str, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Admission(Generic[T]):
    def __init__(
        self,
        *,
        kind: str,
        capacity: int,
        metrics: Metrics,
        active: Gauge,
        per_owner: int | None = None,
        frees_in: Callable[[T], float | None] | None = None,
    ) -> None:
        """`per_owner` caps what one principal holds; `frees_in(item)` says in how many seconds an item will close
        for sure (a session still connecting has a deadline), or None when nobody knows."""
        self.kind = kind
        self.capacity = capacity
        self.per_owner = per_owner
        self._frees_in = frees_in
        self._owners: dict[str, str] = {}
        self._reserved_by: dict[str, int] = {}
        self._metrics = metrics
        self._active = active
        self._open: dict[str, T] = {}
        self._reserved = 0
        self._accepting = True

    def __len__(self) -> int:
        return len(self._open)

    def items(self) -> list[T]:
        return list(self._open.values())

    def get(self, item_id: str) -> T | None:
        return self._open.get(item_id)

    def held_by(self, owner: str) -> int:
        return sum(1 for o in self._owners.values() if o == owner) + self._reserved_by.get(owner, 0)

    @contextlib.contextmanager
    def reserve(self, owner: str = "") -> Iterator[None]:
        """Hold a slot while an item opens; `AdmissionError` (counted) when there is none or the server stops."""
        if not self._accepting:
            self._reject("shutting_down", "the server is shutting down")
        if self.per_owner is not None and self.held_by(owner) >= self.per_owner:
            self._reject("owner_capacity", f"you hold {self.per_owner} {self.kind}s, the most one client may", owner)
        if len(self._open) + self._reserved >= self.capacity:
            self._reject("capacity", f"all {self.capacity} {self.kind} slots are taken")
        self._reserved += 1
        self._reserved_by[owner] = self._reserved_by.get(owner, 0) + 1
        try:
            yield
        finally:
            self._reserved -= 1
            self._reserved_by[owner] -= 1
            if not self._reserved_by[owner]:
                del self._reserved_by[owner]

    def admit(self, item_id: str, item: T, owner: str = "") -> None:
        """Count an item that opened (call inside `reserve`)."""
        self._open[item_id] = item
        self._owners[item_id] = owner
        self._active.set(len(self._open))

    def release(self, item_id: str) -> T | None:
        """Forget an item that closes; the item, or None when it was not open."""
        item = self._open.pop(item_id, None)
        self._owners.pop(item_id, None)
        self._active.set(len(self._open))
        return item

    def owner_of(self, item_id: str) -> str | None:
        return self._owners.get(item_id)

    async def close_all(self, close: Callable[[T], Awaitable[object]], grace_s: float) -> bool:
        """Refuse new items and close all open ones; False if some did not finish within `grace_s`."""
        self._accepting = False
        items = list(self._open.values())
        if not items:
            return True
        closers = [asyncio.ensure_future(close(item)) for item in items]
        _, pending = await asyncio.wait(closers, timeout=grace_s)
        return not pending

    def _soonest_free(self, owner: str | None) -> float | None:
        """Seconds until the first slot (of `owner`, or any) frees for sure; None when none has a deadline."""
        if self._frees_in is None:
            return None
        waits = [
            wait
            for item_id, item in self._open.items()
            if owner is None or self._owners.get(item_id) == owner
            if (wait := self._frees_in(item)) is not None
        ]
        return max(0.0, min(waits)) if waits else None

    def _reject(self, reason: str, message: str, owner: str | None = None) -> None:
        self._metrics.admission_rejections.labels(self.kind, reason).inc()
        raise AdmissionError(message, self._soonest_free(owner if reason == "owner_capacity" else None))
