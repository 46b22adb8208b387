"""Request body limits, enforced from the headers before any of the body is read, and again while reading."""

import json
from collections.abc import AsyncGenerator, Callable

from fastapi import HTTPException, Request
from starlette.types import ASGIApp, Receive, Scope, Send

BODY_METHODS = {"POST", "PUT", "PATCH"}


class BodyLimitMiddleware:
    """Answers 411 to chunked bodies and 413 to a Content-Length above the route's limit, without reading.

    `limit_for(path)` gives the byte limit for a request path."""

    def __init__(self, app: ASGIApp, limit_for: Callable[[str], int]) -> None:
        self.app = app
        self.limit_for = limit_for

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        length: str | None = None
        chunked = False
        for key, value in scope["headers"]:
            if key == b"content-length":
                length = value.decode("latin-1")
            elif key == b"transfer-encoding" and b"chunked" in value.lower():
                chunked = True
        limit = self.limit_for(scope["path"])
        if chunked:
            await _reply(send, 411, "send the body with a Content-Length (chunked bodies are not accepted)")
            return
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await _reply(send, 400, "invalid Content-Length")
                return
            if declared > limit:
                await _reply(send, 413, f"body of {declared} bytes is over the limit of {limit} bytes")
                return
        await self.app(scope, receive, send)


async def _reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def capped_stream(request: Request, limit: int) -> AsyncGenerator[bytes, None]:
    """The request body in chunks, failing with 413 as soon as more than `limit` bytes arrived."""
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise HTTPException(413, f"body is over the limit of {limit} bytes")
        yield chunk


async def read_capped(request: Request, limit: int) -> bytes:
    parts = [chunk async for chunk in capped_stream(request, limit)]
    return b"".join(parts)


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
