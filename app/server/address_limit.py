"""Rate limits per client address that apply before authentication, so that an unauthenticated flood meets a
429 instead of the key check, the failure delay and the route behind them.

* `POST` requests to the API (uploads, sessions, streams, restarts, WHEP viewers, ...) per client address;
* failed authentications (answers of 401) per client address: once over, every API request from the address is
  answered 429 before its credentials are looked at, until the window lets one in again.

`/healthz`, `/readyz` and `/metrics` are never refused here (they are outside `/v1`): probes and scrapers keep
working while an address is limited. The per-principal limits of `ratelimit.py` still apply after
authentication. Counting is the `limits` library's moving window, in memory.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass

from limits import RateLimitItem, parse
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter
from starlette.types import ASGIApp, Message, Receive, Scope, Send

API_PREFIX = "/v1"


@dataclass(frozen=True)
class AddressLimits:
    posts: str = "120/minute"  # the sum of the per-principal creation limits, with room for WHEP viewers
    auth_failures: str = "30/minute"


class AddressLimiter:
    def __init__(self, limits: AddressLimits) -> None:
        self.posts: RateLimitItem = parse(limits.posts)
        self.auth_failures: RateLimitItem = parse(limits.auth_failures)
        self._limiter = MovingWindowRateLimiter(MemoryStorage())

    def refusal(self, method: str, address: str) -> tuple[str, int] | None:
        """(reason, Retry-After seconds) when a request from `address` is refused now; counts the POSTs."""
        if not self._limiter.test(self.auth_failures, "auth_failures", address):
            reason = f"too many failed authentications from this address: the limit is {self.auth_failures}"
            return reason, self._retry_after(self.auth_failures, "auth_failures", address)
        if method == "POST" and not self._limiter.hit(self.posts, "posts", address):
            reason = f"too many requests from this address: the limit is {self.posts} POST requests"
            return reason, self._retry_after(self.posts, "posts", address)
        return None

    def failed_authentication(self, address: str) -> None:
        self._limiter.hit(self.auth_failures, "auth_failures", address)

    def _retry_after(self, item: RateLimitItem, *identifiers: str) -> int:
        reset = self._limiter.get_window_stats(item, *identifiers).reset_time
        return max(1, math.ceil(reset - time.time()))


class AddressLimitMiddleware:
    def __init__(self, app: ASGIApp, limiter: AddressLimiter) -> None:
        self.app = app
        self.limiter = limiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == API_PREFIX or path.startswith(API_PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = client[0] if client else "unknown"
        refused = self.limiter.refusal(scope["method"], address)
        if refused is not None:
            await _too_many(send, *refused)
            return

        async def noting_failures(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                self.limiter.failed_authentication(address)
            await send(message)

        await self.app(scope, receive, noting_failures)


async def _too_many(send: Send, detail: str, retry_after_s: int) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"retry-after", str(retry_after_s).encode()),
    ]
    await send({"type": "http.response.start", "status": 429, "headers": headers})
    await send({"type": "http.response.body", "body": body})
