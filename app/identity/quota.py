"""Per-owner storage quotas for identities: how many, and how many bytes on disk.

`usage_of(owner)` says what an owner holds now: the store's sum over the identities that owner created.
"""

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from app.errors import StatusError

T = TypeVar("T")


@dataclass(frozen=True)
class Usage:
    count: int
    bytes: int


class QuotaExceeded(StatusError):
    """An upload over its owner's quota; `status` is 409 for the count, 413 for the bytes."""


@dataclass(frozen=True)
class IdentityQuota:
    max_count: int
    max_bytes: int
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def check(self, usage: Usage, adding_bytes: int = 0) -> None:
        """`QuotaExceeded` when one more identity of `adding_bytes` would not fit."""
        if usage.count + 1 > self.max_count:
            raise QuotaExceeded(
                409, f"identity quota reached: {usage.count} stored, the limit is {self.max_count}; delete one first"
            )
        if usage.bytes + adding_bytes > self.max_bytes:
            raise QuotaExceeded(
                413,
                f"identity storage quota reached: {usage.bytes} + {adding_bytes} bytes is over the limit of "
                f"{self.max_bytes} bytes",
            )

    def create_within(self, usage: Callable[[], Usage], adding_bytes: int, create: Callable[[], T]) -> T:
        """Check and create as one step (usage read under the lock, `create` run under it), so parallel uploads
        cannot overshoot the quota."""
        with self._lock:
            self.check(usage(), adding_bytes)
            return create()
