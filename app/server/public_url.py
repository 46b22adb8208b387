"""Absolute `Location` URLs: with a public base URL per replica, a client (or a router) reaches the replica
that owns a session directly instead of whichever replica a load balancer picks."""

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class AbsoluteLocation:
    """ASGI middleware: a `Location` that is a path (`/v1/sessions/ID`) gets the base URL in front."""

    def __init__(self, app: ASGIApp, *, base_url: str) -> None:
        self.app = app
        self.base_url = base_url.rstrip("/")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_absolute(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                location = headers.get("location")
                if location is not None and location.startswith("/") and not location.startswith("//"):
                    headers["location"] = self.base_url + location
            await send(message)

        await self.app(scope, receive, send_absolute)
