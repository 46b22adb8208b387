"""Rate limits on creating things (identity uploads, sessions, streams, WHEP viewers, minted credentials: viewer
tokens and TURN logins), per principal and per client address,
answered with 429 and an honest `Retry-After` (when the moving window lets the next request in).

Counting is the `limits` library's moving window, in memory: one server process owns its counters.
"""

import math
import time
from collections.abc import Mapping
from typing import Literal, get_args

from limits import RateLimitItem, parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

Action = Literal["uploads", "sessions", "streams", "credentials", "viewers"]


class RateLimited(Exception):
    """Too many requests of one kind; answered with 429 and `Retry-After: retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


RATE_ACTIONS: tuple[Action, ...] = get_args(Action)


class RateLimiter:
    def __init__(self, limits: Mapping[Action, str]) -> None:
        """`limits`: every action's limit in the `limits` package's notation, such as "10/minute"."""
        self._items: dict[Action, RateLimitItem] = {action: parse(limits[action]) for action in RATE_ACTIONS}
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def hit(self, action: Action, principal: str, address: str) -> None:
        """Count one request of `action`, or `RateLimited` when its principal or its client address is over the
        limit (the address counts too, so many principals from one client share one budget)."""
        item = self._items[action]
        keys = (("principal", principal), ("address", address))
        for kind, key in keys:
            if not self._limiter.test(item, action, kind, key):
                raise RateLimited(
                    f"too many {action}: the limit is {item} per {kind}", self._retry_after(item, action, kind, key)
                )
        for kind, key in keys:
            self._limiter.hit(item, action, kind, key)

    def _retry_after(self, item: RateLimitItem, *identifiers: str) -> int:
        reset = self._limiter.get_window_stats(item, *identifiers).reset_time
        return max(1, math.ceil(reset - time.time()))
