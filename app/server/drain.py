"""Draining: stop admitting sessions and streams, let the open ones run to their end or until the drain
timeout, then stop the server. Started by SIGTERM (see `DrainingServer`) or `POST /v1/server/drain`.

While draining, `/readyz` answers 503 (a load balancer or Kubernetes stops sending new work), and new
sessions and streams get 503 with `Retry-After` (a router retries them on another replica); every other
request, including those of open sessions, is served as before.
"""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

POLL_S = 0.2
ADMISSION_PATHS = {"/v1/sessions": "session", "/v1/streams": "stream"}


class Drain:
    def __init__(self, timeout_s: float, open_count: Callable[[], int], *, poll_s: float = POLL_S) -> None:
        self.timeout_s = timeout_s
        self._open_count = open_count
        self._poll_s = poll_s
        self.on_drained: Callable[[], None] | None = None  # the server stops here
        self.draining = False
        self.drained = False
        self._started: float | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    def request(self) -> bool:
        """Begin draining from a signal handler or another thread; False before the server has started."""
        if self._loop is None or self._loop.is_closed():
            return False
        self._loop.call_soon_threadsafe(self.begin)
        return True

    def begin(self) -> bool:
        """Begin draining (on the event loop); False when it had already begun."""
        if self.draining:
            return False
        self.draining = True
        self._started = time.monotonic()
        log.warning("draining: %d open, waiting up to %.0f s for them to end", self._open_count(), self.timeout_s)
        self._task = asyncio.get_running_loop().create_task(self._wait(), name="swapcast-drain")
        return True

    async def _wait(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        # Polled: sessions and streams end on their own paths (client DELETE, media timeout, errors) and the
        # managers expose a count, not an event; a 0.2 s poll costs nothing beside video.
        while True:
            if self._open_count() == 0 or time.monotonic() >= deadline:
                break
            await asyncio.sleep(self._poll_s)
        left = self._open_count()
        if left:
            log.warning("drain timeout: %d sessions or streams still open are closed now", left)
        self.drained = True
        if self.on_drained is not None:
            self.on_drained()

    def status(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self._started if self._started is not None else 0.0
        return {
            "draining": self.draining,
            "drained": self.drained,
            "open": self._open_count(),
            "timeout_s": self.timeout_s,
            "seconds_left": max(0.0, self.timeout_s - elapsed) if self.draining else None,
        }


class DrainGate:
    """ASGI middleware: while draining, `/readyz` and new sessions and streams answer 503."""

    def __init__(
        self, app: ASGIApp, *, drain: Drain, retry_after_s: int, on_refused: Callable[[str], None] | None = None
    ) -> None:
        self.app = app
        self.drain = drain
        self.retry_after = str(retry_after_s)
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and self.drain.draining:
            path = scope["path"].rstrip("/") or "/"
            if path == "/readyz":
                body = {"status": "not ready", "reason": "draining", **self.drain.status()}
                await JSONResponse(body, 503, {"Retry-After": self.retry_after})(scope, receive, send)
                return
            resource = ADMISSION_PATHS.get(path)
            if resource is not None and scope["method"] == "POST":
                if self.on_refused is not None:
                    self.on_refused(resource)
                detail = f"this server is draining and takes no new {resource}s: retry on another"
                await JSONResponse({"detail": detail}, 503, {"Retry-After": self.retry_after})(scope, receive, send)
                return
        await self.app(scope, receive, send)
