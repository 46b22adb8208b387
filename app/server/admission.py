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
    """No room for another session or stream (answered with 503 and Retry-After)."""


class Admission(Generic[T]):
    def __init__(self, *, kind: str, capacity: int, metrics: Metrics, active: Gauge) -> None:
        self.kind = kind
        self.capacity = capacity
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

    @contextlib.contextmanager
    def reserve(self) -> Iterator[None]:
        """Hold a slot while an item opens; `AdmissionError` (counted) when there is none or the server stops."""
        if not self._accepting:
            self._reject("shutting_down", "the server is shutting down")
        if len(self._open) + self._reserved >= self.capacity:
            self._reject("capacity", f"all {self.capacity} {self.kind} slots are taken")
        self._reserved += 1
        try:
            yield
        finally:
            self._reserved -= 1

    def admit(self, item_id: str, item: T) -> None:
        """Count an item that opened (call inside `reserve`)."""
        self._open[item_id] = item
        self._active.set(len(self._open))

    def release(self, item_id: str) -> T | None:
        """Forget an item that closes; the item, or None when it was not open."""
        item = self._open.pop(item_id, None)
        self._active.set(len(self._open))
        return item

    async def close_all(self, close: Callable[[T], Awaitable[object]], grace_s: float) -> bool:
        """Refuse new items and close all open ones; False if some did not finish within `grace_s`."""
        self._accepting = False
        items = list(self._open.values())
        if not items:
            return True
        closers = [asyncio.ensure_future(close(item)) for item in items]
        _, pending = await asyncio.wait(closers, timeout=grace_s)
        return not pending

    def _reject(self, reason: str, message: str) -> None:
        self._metrics.admission_rejections.labels(self.kind, reason).inc()
        raise AdmissionError(message)
