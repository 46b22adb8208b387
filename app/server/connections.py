"""Bounds on HTTP connections, against slow and idle clients: a deadline for a request's headers, an idle
keep-alive timeout, and a cap on open connections in total and per client address.

uvicorn bounds neither header reads nor connections: 300 connections that each sent part of a request's headers
were held indefinitely and ran a low `ulimit` out of file descriptors. `guarded_http` is uvicorn's own httptools
protocol with those bounds added; connections over a cap get a 503 and are closed at once.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_REFUSAL_BODY = b'{"detail": "too many open connections"}'
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Type: application/json\r\n"
    + f"Content-Length: {len(_REFUSAL_BODY)}\r\nConnection: close\r\n\r\n".encode()
    + _REFUSAL_BODY
)


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 512
    max_per_client: int = 64


class ConnectionCounter:
    """Open connections per client address; used on the event loop's thread only."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.total = 0
        self.by_client: dict[str, int] = {}

    def admit(self, client: str) -> bool:
        if self.total >= self.limits.max_connections:
            return False
        if self.by_client.get(client, 0) >= self.limits.max_per_client:
            return False
        self.total += 1
        self.by_client[client] = self.by_client.get(client, 0) + 1
        return True

    def release(self, client: str) -> None:
        self.total -= 1
        left = self.by_client[client] - 1
        if left:
            self.by_client[client] = left
        else:
            del self.by_client[client]


def guarded_http(limits: ConnectionLimits) -> tuple[type[HttpToolsProtocol], ConnectionCounter]:
    """uvicorn's httptools protocol with the header deadline and the connection caps, and its counter."""
    counter = ConnectionCounter(limits)

    class GuardedHttpProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _counted: str | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            client = self.client[0] if self.client else "unknown"
            if not counter.admit(client):
                transport.write(REFUSAL)
                transport.close()
                return
            self._counted = client
            self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if self._awaiting_headers():
                self._arm_header_timer()  # a request starts: its headers must be complete in time
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._disarm_header_timer()
            super().on_headers_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            if self._counted is not None:
                counter.release(self._counted)
                self._counted = None
            super().connection_lost(exc)

        def _awaiting_headers(self) -> bool:
            return self.cycle is None or self.cycle.response_complete

        def _arm_header_timer(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(limits.header_timeout_s, self._headers_too_slow)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self._awaiting_headers() and not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpProtocol, counter


def uvicorn_options(limits: ConnectionLimits) -> dict[str, Any]:
    """Keyword arguments for `uvicorn.Config` that apply the limits."""
    protocol, _ = guarded_http(limits)
    return {"http": protocol, "timeout_keep_alive": limits.keep_alive_s}
