"""Bounds on HTTP connections, against slow, idle and bloated clients: a deadline for a request's headers, a cap
on the header block's size, an idle keep-alive timeout, and a cap on open connections in total and per client
address.

uvicorn bounds neither header reads nor connections: 300 connections that each sent part of a request's headers
were held indefinitely and ran a low `ulimit` out of file descriptors, and its httptools protocol reads headers
of any size (16 connections with a 64 MB header each took the server from 326 to 886 MB). `guarded_http` is
uvicorn's own httptools protocol with those bounds added; connections over a cap get a 503, a header block over
its cap a 431, and are closed at once. The header bytes are counted as they arrive, before the parser sees them.
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
HEADER_END = b"\r\n\r\n"


def header_refusal(max_bytes: int) -> bytes:
    body = f'{{"detail": "request headers larger than {max_bytes} bytes"}}'.encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    keep_alive_s: float = 5.0
    max_connections: int = 512
    max_per_client: int = 64
    max_header_bytes: int = 32 * 1024


class HeaderBlockMeter:
    """Bytes of one request's header block so far, fed the raw bytes as they arrive: `over` once the block (up
    to and including its blank line) exceeds the cap. Body bytes after the blank line are not counted."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.seen = 0
        self._tail = b""  # the last bytes seen, for a blank line split across two reads

    def reset(self) -> None:
        self.seen = 0
        self._tail = b""

    def over(self, data: bytes) -> bool:
        joined = self._tail + data
        end = joined.find(HEADER_END)
        if end >= 0:
            return self.seen + end - len(self._tail) + len(HEADER_END) > self.max_bytes
        self.seen += len(data)
        self._tail = joined[-(len(HEADER_END) - 1) :]
        return self.seen > self.max_bytes


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
    too_large = header_refusal(limits.max_header_bytes)

    class GuardedHttpProtocol(HttpToolsProtocol):
        _header_timer: asyncio.TimerHandle | None = None
        _counted: str | None = None
        _meter: HeaderBlockMeter | None = None
        # Between requests and inside a header block; off from headers-complete until the message's end, so
        # body bytes are never counted as headers.
        _in_header_block = True

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
            if self._in_header_block:
                if self._meter is None:
                    self._meter = HeaderBlockMeter(limits.max_header_bytes)
                if self._meter.over(data):
                    self._disarm_header_timer()
                    self.transport.write(too_large)
                    self.transport.close()
                    return
            super().data_received(data)

        def on_headers_complete(self) -> None:
            self._disarm_header_timer()
            self._in_header_block = False
            if self._meter is not None:
                self._meter.reset()
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._in_header_block = True
            super().on_message_complete()

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
