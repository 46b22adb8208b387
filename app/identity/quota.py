"""Per-owner storage quotas for identities: how many, and how many bytes on disk.

`usage_of(owner)` says what an owner holds now: the store's sum over the identities that owner created.
"""

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    count: int
    bytes: int


class QuotaExceeded(Exception):
    """An upload over its owner's quota; `status` is 409 for the count, 413 for the bytes."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class IdentityQuota:
    max_count: int
    max_bytes: int

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


UsageOf = Callable[[str], Usage]
