"""What operators and the page need from a deployment: draining a replica, and the ICE servers (with TURN
credentials) the page connects with."""

import ipaddress
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse

from app.auth.guard import PUBLIC, Authenticated, SessionsUser
from app.server.deps import StateDep
from app.server.drain import Drain
from app.server.ice import client_ice_servers

router = APIRouter(tags=["operations"])
PROXY_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


def get_drain(request: Request) -> Drain:
    drain: Drain = request.app.state.drain
    return drain


def _local_operator(request: Request) -> None:
    """Draining is for the host's own operator (a Kubernetes preStop hook, an admin on the machine): the
    request must come from loopback and not through a proxy (HAProxy adds X-Forwarded-For)."""
    host = request.client.host if request.client else ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback or any(name in request.headers for name in PROXY_HEADERS):
        raise HTTPException(403, "draining is allowed only from this host, not through a proxy")


# Public in the access rules: only this host's own operator (loopback, not proxied) may drain, which no credential
# changes; over the network it is refused for everyone.
@router.post("/v1/server/drain", status_code=202, dependencies=PUBLIC)
async def drain_server(request: Request) -> JSONResponse:
    """Stop admitting sessions and streams; the server stops when the open ones end or the drain times out."""
    _local_operator(request)
    drain = get_drain(request)
    drain.begin()
    return JSONResponse(drain.status(), status_code=202)


@router.get("/v1/server/drain")
async def drain_status(request: Request, principal: Authenticated) -> dict[str, Any]:
    return get_drain(request).status()


@router.get("/v1/ice-servers")
async def ice_servers(state: StateDep, principal: SessionsUser) -> dict[str, Any]:
    """ICE servers for the page's RTCPeerConnection; TURN credentials minted per call when a secret is set."""
    s = state.settings
    servers = client_ice_servers(list(s.ice_servers), s.ice)
    return {"iceServers": servers, "ttl_s": s.ice.turn_ttl_s if s.ice.turn_secret is not None else None}
