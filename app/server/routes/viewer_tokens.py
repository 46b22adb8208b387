"""Viewer tokens for an output: minted by its owner (or admin) for OBS's Browser Source or any WHEP player,
listed, and revoked (which ends the viewers opened with the token). The token is shown once, in the answer
to `POST`; the server keeps only its hash."""

from typing import Annotated, Any

from fastapi import APIRouter, Path, Request, Response

from app.auth.access import Access
from app.auth.guard import AccessDep, SessionsUser, StreamsUser, client_address
from app.auth.principal import Principal
from app.auth.viewer_tokens import ViewerToken
from app.server.deps import RevocationDep, SessionsDep, StateDep, StreamsDep
from app.server.owned import owned_session, owned_stream
from app.server.revocation import RevocationWatcher
from app.server.state import ServerState
from app.server.viewers import ViewerTokenNotFound

router = APIRouter(tags=["viewer tokens"])

OutputId = Annotated[str, Path(min_length=1, max_length=64)]
TokenId = Annotated[str, Path(min_length=1, max_length=64)]


def mint(
    request: Request, state: ServerState, access: Access, principal: Principal, output: str, resource: object
) -> dict[str, Any]:
    state.rate_limiter.hit("credentials", principal.id, client_address(request))
    ownership = access.owners.of(resource)
    owner = ownership.owner if ownership is not None else principal.id
    record, token = access.viewer_tokens.mint(output, owner, principal)
    kind, output_id = output.split("/", 1)
    page = f"/view/{output_id}" if kind == "session" else f"/view/stream/{output_id}"
    return {
        **record.public(),
        "token": token,
        "view_url": f"{page}?token={token}",
        "whep_url": f"/v1/{kind}s/{output_id}/whep",
    }


def listing(tokens: list[ViewerToken]) -> dict[str, Any]:
    return {"viewer_tokens": [t.public() for t in tokens]}


async def revoke(access: Access, revocation: RevocationWatcher, output: str, token_id: str) -> Response:
    record = access.viewer_tokens.get(output, token_id)
    if record is None:
        raise ViewerTokenNotFound(token_id)
    await revocation.revoke_viewer_token(record)
    return Response(status_code=204)


@router.post("/v1/sessions/{session_id}/viewer-tokens", status_code=201)
async def mint_session_token(
    session_id: OutputId,
    request: Request,
    principal: SessionsUser,
    access: AccessDep,
    state: StateDep,
    sessions: SessionsDep,
) -> dict[str, Any]:
    """A read-only token for this session's WHEP endpoint and viewer page (`view_url` goes into OBS)."""
    session = owned_session(sessions, session_id, principal, access)
    return mint(request, state, access, principal, f"session/{session.id}", session)


@router.get("/v1/sessions/{session_id}/viewer-tokens")
async def session_tokens(
    session_id: OutputId, principal: SessionsUser, access: AccessDep, sessions: SessionsDep
) -> dict[str, Any]:
    session = owned_session(sessions, session_id, principal, access)
    return listing(access.viewer_tokens.of_output(f"session/{session.id}"))


@router.delete("/v1/sessions/{session_id}/viewer-tokens/{token_id}", status_code=204)
async def revoke_session_token(
    session_id: OutputId,
    token_id: TokenId,
    principal: SessionsUser,
    access: AccessDep,
    revocation: RevocationDep,
    sessions: SessionsDep,
) -> Response:
    """Revoke the token; the viewers opened with it end now."""
    session = owned_session(sessions, session_id, principal, access)
    return await revoke(access, revocation, f"session/{session.id}", token_id)


@router.post("/v1/streams/{stream_id}/viewer-tokens", status_code=201)
async def mint_stream_token(
    stream_id: OutputId,
    request: Request,
    principal: StreamsUser,
    access: AccessDep,
    state: StateDep,
    streams: StreamsDep,
) -> dict[str, Any]:
    """A read-only token for this stream's WHEP endpoint and viewer page."""
    stream = owned_stream(streams, stream_id, principal, access)
    return mint(request, state, access, principal, f"stream/{stream.id}", stream)


@router.get("/v1/streams/{stream_id}/viewer-tokens")
async def stream_tokens(
    stream_id: OutputId, principal: StreamsUser, access: AccessDep, streams: StreamsDep
) -> dict[str, Any]:
    stream = owned_stream(streams, stream_id, principal, access)
    return listing(access.viewer_tokens.of_output(f"stream/{stream.id}"))


@router.delete("/v1/streams/{stream_id}/viewer-tokens/{token_id}", status_code=204)
async def revoke_stream_token(
    stream_id: OutputId,
    token_id: TokenId,
    principal: StreamsUser,
    access: AccessDep,
    revocation: RevocationDep,
    streams: StreamsDep,
) -> Response:
    """Revoke the token; the viewers opened with it end now."""
    stream = owned_stream(streams, stream_id, principal, access)
    return await revoke(access, revocation, f"stream/{stream.id}", token_id)
