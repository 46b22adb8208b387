"""FastAPI dependencies that put a route behind a scope: `Annotated[Principal, Depends(requires(SCOPE))]`.

Every route declares its rule (a scope, any authenticated principal, or public), and the rule is readable from
the route table (`access_rule`), so a test can check that no route was added without one."""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.auth.access import Access, Unauthenticated
from app.auth.keys import KeyStoreError
from app.auth.principal import Principal
from app.auth.scopes import ADMIN, ALL_SCOPES, IDENTITIES_READ, IDENTITIES_WRITE, METRICS, SESSIONS, STREAMS

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description=(
        "An API key (`swapcast keys create NAME --scope ...`, starts with `sk_`) or a JWT from the configured "
        f"identity provider. Scopes: {', '.join(ALL_SCOPES)}. Not needed in local mode (loopback, nothing configured)."
    ),
)


@dataclass(frozen=True)
class AccessRule:
    scope: str | None  # None: any authenticated principal
    public: bool = False
    viewer_token: bool = False  # a viewer token of the route's output is accepted as well


def get_access(request: Request) -> Access:
    access: Access = request.app.state.access
    return access


def client_address(request: Request) -> str:
    return request.client.host if request.client else "unknown"


async def _refuse(request: Request, access: Access, exc: Unauthenticated) -> HTTPException:
    address = client_address(request)
    access.audit.event(
        "auth_failure",
        client=address,
        method=request.method,
        path=request.url.path,
        reason=str(exc),
        key_id=exc.key_id,
    )
    await asyncio.sleep(access.failures.record(address))
    challenge = 'Bearer realm="swapcast"' + (', error="invalid_token"' if exc.invalid else "")
    return HTTPException(401, str(exc), headers={"WWW-Authenticate": challenge})


def requires(scope: str | None, *, viewer_token: bool = False) -> Callable[..., Awaitable[Principal]]:
    """A dependency resolving the request's principal; 401 without valid credentials, 403 without `scope`.
    `viewer_token`: a viewer token is accepted too (its principal has no scopes; the route checks that it
    watches the output asked for)."""

    async def principal(
        request: Request, credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)]
    ) -> Principal:
        access = get_access(request)
        token = credentials.credentials if credentials else None
        try:
            who = access.authenticate_viewer(token) if viewer_token else access.authenticate(token)
        except Unauthenticated as exc:
            raise await _refuse(request, access, exc) from None
        except KeyStoreError as exc:
            raise HTTPException(503, str(exc)) from None
        if who.kind == "viewer":
            return who
        if scope is not None and not who.allows(scope):
            access.audit.event(
                "auth_forbidden", client=client_address(request), principal=who.id, path=request.url.path, scope=scope
            )
            raise HTTPException(403, f"this credential lacks the `{scope}` scope")
        return who

    principal.access_rule = AccessRule(scope, viewer_token=viewer_token)  # type: ignore[attr-defined]
    return principal


async def public() -> None:
    """Marks a route as open to everyone (liveness, readiness, the page)."""


public.access_rule = AccessRule(None, public=True)  # type: ignore[attr-defined]

PUBLIC = [Depends(public)]
Authenticated = Annotated[Principal, Depends(requires(None))]
IdentitiesRead = Annotated[Principal, Depends(requires(IDENTITIES_READ))]
IdentitiesWrite = Annotated[Principal, Depends(requires(IDENTITIES_WRITE))]
SessionsUser = Annotated[Principal, Depends(requires(SESSIONS))]
StreamsUser = Annotated[Principal, Depends(requires(STREAMS))]
MetricsReader = Annotated[Principal, Depends(requires(METRICS))]
Admin = Annotated[Principal, Depends(requires(ADMIN))]
AccessDep = Annotated[Access, Depends(get_access)]


def access_rule(route: APIRoute) -> AccessRule | None:
    """The rule a route declared through its dependencies, or None when it declared none."""
    stack = list(route.dependant.dependencies)
    while stack:
        dependant = stack.pop()
        rule = getattr(dependant.call, "access_rule", None)
        if isinstance(rule, AccessRule):
            return rule
        stack.extend(dependant.dependencies)
    return None
