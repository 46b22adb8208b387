"""What a web page elsewhere must not do with this server, enforced before any route runs.

- `Host` must name this server: a DNS-rebinding page reaches a loopback server under its own host name
  (probes excepted).
- A state-changing request that carries an `Origin` must come from this server's own page or an allowed origin.
- A POST that a page elsewhere could send without a CORS preflight (a "simple" request: form or text body, no
  custom header) is refused unless it carries `Authorization` or `X-Swapcast`; a cross-site form cannot add
  either, and `fetch` from another origin cannot without a preflight this server does not grant.
- The pages (`/`, the viewer page `/view/...`, the API explorer `/docs`) get a restrictive
  Content-Security-Policy and may not be framed; every response gets `nosniff`.
"""

import json
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATE_CHANGING = {"POST", "PUT", "PATCH", "DELETE"}
SIMPLE_CONTENT_TYPES = {"application/x-www-form-urlencoded", "multipart/form-data", "text/plain", ""}
CUSTOM_HEADER = "x-swapcast"
# Probes (a kubelet calls with the pod's address as Host) answer anyone: they reveal nothing.
ANY_HOST_PATHS = {"/healthz", "/readyz"}
PAGE_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' blob: data:; "
    "media-src 'self' blob: mediastream:; connect-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
DEFAULT_PORTS = {"http": 80, "https": 443}


def host_name(host_header: str) -> str | None:
    """The host name of a Host header value (`[::1]:8000` -> `::1`), or None when it is malformed."""
    try:
        parts = urlsplit(f"//{host_header}")
        name = parts.hostname
        _ = parts.port  # raises on a malformed port
    except ValueError:
        return None
    return name.lower() if name else None


def origin_of(url: str) -> tuple[str, str, int] | None:
    try:
        parts = urlsplit(url)
        scheme, name = parts.scheme.lower(), (parts.hostname or "").lower()
        port = parts.port or DEFAULT_PORTS.get(scheme, 0)
    except ValueError:
        return None
    return (scheme, name, port) if scheme and name else None


class BrowserGuard:
    def __init__(self, app: ASGIApp, *, allowed_hosts: Iterable[str], allowed_origins: Iterable[str] = ()) -> None:
        self.app = app
        self.hosts = {h.lower() for h in allowed_hosts}
        self.any_host = "*" in self.hosts
        self.origins = {o for o in (origin_of(url) for url in allowed_origins) if o is not None}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            await _reply(send, *refusal)
            return
        page = scope["path"] in ("/", "/docs") or scope["path"].startswith(("/static/", "/view/"))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                out = MutableHeaders(scope=message)
                out["X-Content-Type-Options"] = "nosniff"
                out["Referrer-Policy"] = "no-referrer"
                if page:
                    out["Content-Security-Policy"] = PAGE_CSP
                    out["X-Frame-Options"] = "DENY"
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _refusal(self, scope: Scope, headers: Headers) -> tuple[int, str] | None:
        host = host_name(headers.get("host", ""))
        if not self.any_host and host not in self.hosts and scope["path"] not in ANY_HOST_PATHS:
            return 400, "unknown Host header: this server answers only to its own names (SWAPCAST_ALLOWED_HOSTS)"
        if scope["method"] not in STATE_CHANGING:
            return None
        origin = headers.get("origin")
        if origin is not None and origin != "null":
            own = origin_of(f"{scope.get('scheme', 'http')}://{headers.get('host', '')}")
            theirs = origin_of(origin)
            if theirs is None or (theirs != own and theirs not in self.origins):
                return 403, f"cross-origin request from {origin[:100]} refused (SWAPCAST_CORS_ORIGINS)"
        elif origin == "null":
            return 403, "request from an opaque origin refused"
        content_type = headers.get("content-type", "").split(";", 1)[0].strip().lower()
        simple = scope["method"] == "POST" and content_type in SIMPLE_CONTENT_TYPES
        if simple and "authorization" not in headers and CUSTOM_HEADER not in headers:
            return 403, "send this request with an `X-Swapcast: 1` or an `Authorization` header (cross-site protection)"
        return None


async def _reply(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"x-content-type-options", b"nosniff"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
