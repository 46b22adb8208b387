"""`swapcast drain`: ask the server on this host to drain (a Kubernetes preStop hook, an operator on the box).

The drain route needs the `admin` scope once credentials are configured. Keys are stored hashed, so the command
cannot make one up: it sends `--key` when given, else, where the server verifies JWTs with a shared secret
(SWAPCAST_JWT_SECRET, as the Kubernetes manifests set it), a one-minute admin token signed with that secret,
else nothing (local mode)."""

import argparse
import json
import time
import uuid
from typing import TYPE_CHECKING

from app.errors import UserError, server_reason

if TYPE_CHECKING:
    from app.server.settings import ServerSettings

TOKEN_LIFETIME_S = 60


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("drain", help="ask the local server to drain (stop admitting, stop when the open ones end)")
    p.add_argument("--url", default=None, help="the server's base URL (default: this host's SWAPCAST_PORT)")
    p.add_argument("--key", default=None, help="an admin API key (default: a token from SWAPCAST_JWT_SECRET)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import httpx

    from app.server.settings import ServerSettings

    settings = ServerSettings()
    scheme = "https" if settings.access.tls else "http"
    base = (args.url or f"{scheme}://127.0.0.1:{settings.port}").rstrip("/")
    credential = args.key or admin_token(settings)
    headers = {"X-Swapcast": "1"}
    if credential:
        headers["Authorization"] = f"Bearer {credential}"
    try:
        # The certificate names the public host, not 127.0.0.1: this call never leaves the machine.
        response = httpx.post(f"{base}/v1/server/drain", headers=headers, timeout=10, verify=False)
    except httpx.HTTPError as exc:
        raise UserError(f"cannot reach the server at {base}: {exc}") from None
    if response.status_code != 202:
        raise UserError(f"the server refused to drain ({response.status_code}): {server_reason(response)[:200]}")
    print(json.dumps(response.json()))
    return 0


def admin_token(settings: "ServerSettings") -> str | None:
    """A short-lived admin JWT signed with the shared secret the server verifies, or None without one."""
    import jwt

    access = settings.access
    if access.jwt_secret is None:
        return None
    now = int(time.time())
    claims = {
        "sub": "swapcast-drain",
        "aud": access.jwt_audience,
        "iat": now,
        "exp": now + TOKEN_LIFETIME_S,
        "jti": uuid.uuid4().hex,
        "scope": "admin",
    }
    if access.jwt_issuer:
        claims["iss"] = access.jwt_issuer
    return jwt.encode(claims, access.jwt_secret.get_secret_value(), algorithm="HS256")
