"""What operators and the page need from a deployment: draining a replica, and the ICE servers (with TURN
credentials) the page connects with."""

import ipaddress
import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Request, Security
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials

from app.auth.guard import AccessRule, Authenticated, SessionsUser, bearer, client_address, get_access, requires
from app.auth.principal import Principal, local_principal
from app.auth.scopes import ADMIN
from app.server.deps import StateDep
from app.server.drain import Drain
from app.server.ice import client_ice_servers

router = APIRouter(tags=["operations"])
# Headers that proxies, load balancers and CDNs add: any of them means the request did not start on this host.
PROXY_HEADERS = (
    "forwarded",
    "via",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "x-forwarded-port",
    "x-forwarded-prefix",
    "x-forwarded-server",
    "x-real-ip",
    "x-client-ip",
    "x-cluster-client-ip",
    "x-original-forwarded-for",
    "cf-connecting-ip",
    "true-client-ip",
    "fastly-client-ip",
)
_admin = requires(ADMIN)


def get_drain(request: Request) -> Drain:
    drain: Drain = request.app.state.drain
    return drain


def _local_operator(request: Request) -> None:
    """In local mode draining is for the host's own operator: the request must come from loopback and carry no
    header a proxy adds."""
    host = request.client.host if request.client else ""
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback or any(name in request.headers for name in PROXY_HEADERS):
        raise HTTPException(403, "draining is allowed only from this host, not through a proxy")


async def drain_operator(
    request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]
) -> Principal:
    """Who may drain: the `admin` scope whenever credentials are configured (behind a proxy every client comes
    from loopback, so the address proves nothing); in local mode, a request made on this host and not through
    a proxy. SIGTERM is the operator's other way, and `swapcast drain` calls this route with the right one."""
    if get_access(request).local_mode:
        _local_operator(request)
        return local_principal()
    return await _admin(request, credentials)


drain_operator.access_rule = AccessRule(ADMIN)  # type: ignore[attr-defined]
DrainOperator = Annotated[Principal, Depends(drain_operator)]


@router.post("/v1/server/drain", status_code=202)
async def drain_server(request: Request, principal: DrainOperator) -> JSONResponse:
    """Stop admitting sessions and streams; the server stops when the open ones end or the drain times out."""
    get_access(request).audit.event("drain_requested", principal=principal.id, client=client_address(request))
    drain = get_drain(request)
    drain.begin()
    return JSONResponse(drain.status(), status_code=202)


@router.get("/v1/server/drain")
async def drain_status(request: Request, principal: Authenticated) -> dict[str, Any]:
    return get_drain(request).status()


def turn_label(principal: Principal) -> str:
    """The TURN username's label for this principal (`<expiry>:<label>`), so a TURN server's log tells whose
    relay it is; characters a username should not carry become `-`."""
    return re.sub(r"[^A-Za-z0-9._@-]", "-", principal.id)[:64] or "swapcast"


@router.get("/v1/ice-servers")
async def ice_servers(request: Request, state: StateDep, principal: SessionsUser) -> dict[str, Any]:
    """ICE servers for the page's RTCPeerConnection; TURN credentials minted per call (per principal, rate
    limited like other credentials, valid `ttl_s`) when a secret is set."""
    s = state.settings
    minted = s.ice.turn_urls and s.ice.turn_secret is not None
    if minted:
        state.rate_limiter.hit("credentials", principal.id, client_address(request))
    servers = client_ice_servers(list(s.ice_servers), s.ice, turn_label(principal))
    return {"iceServers": servers, "ttl_s": s.ice.turn_ttl_s if s.ice.turn_secret is not None else None}
