"""WebRTC sessions, WHIP-style: POST an SDP offer, get the SDP answer; the swapped video comes back on it."""

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, Field

from app.auth.access import Access
from app.auth.guard import AccessDep, SessionsUser
from app.auth.principal import Principal
from app.identity.store import IdentityNotFound, IdentityUnreadable
from app.media.webrtc import AdmissionError, OfferError, Session, SessionManager, SessionNotFound
from app.pipeline.swap import PreparedSource
from app.server.deps import RevocationDep, SessionsDep, StateDep
from app.server.limits import media_type, read_capped
from app.server.state import NotReady, ServerState

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

SessionId = Annotated[str, Path(min_length=1, max_length=64)]


class SwitchIdentity(BaseModel):
    identity: str = Field(min_length=1, max_length=64)


async def load_identity(state: ServerState, identity_id: str, principal: Principal) -> PreparedSource:
    """The prepared identity if `principal` may use it, or the HTTP error that explains why not (another
    owner's identity is "not found", like a missing one)."""
    try:
        identity = await asyncio.get_running_loop().run_in_executor(
            state.control_executor, state.store.get, identity_id
        )
        if not principal.can_see(identity.owner):
            raise IdentityNotFound(identity_id)
        return await state.load_source(identity_id)
    except IdentityNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    except IdentityUnreadable as exc:
        raise HTTPException(409, str(exc)) from None
    except NotReady as exc:
        retry = {"Retry-After": str(state.settings.retry_after_s)}
        raise HTTPException(503, f"not ready: {exc}", headers=retry) from None


@router.post("", status_code=201)
async def create_session(
    request: Request,
    state: StateDep,
    sessions: SessionsDep,
    principal: SessionsUser,
    revocation: RevocationDep,
    identity: Annotated[str | None, Query(max_length=64)] = None,
) -> Response:
    """Body: the client's SDP offer (`Content-Type: application/sdp`, ICE gathering complete)."""
    settings = state.settings
    if media_type(request) != "application/sdp":
        raise HTTPException(415, "send the offer as application/sdp")
    body = await read_capped(request, settings.sdp_max_bytes)
    if not identity:
        raise HTTPException(422, "query parameter `identity` is required")
    try:
        offer = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "the offer is not UTF-8 text") from None
    if "\x00" in offer:
        raise HTTPException(400, "the offer contains NUL characters")
    source = await load_identity(state, identity, principal)
    try:
        session, answer = await sessions.open(offer, identity, source)
    except AdmissionError as exc:
        raise HTTPException(503, str(exc), headers={"Retry-After": str(settings.retry_after_s)}) from None
    except OfferError as exc:
        raise HTTPException(400, str(exc)) from None
    revocation.session_started(session, principal)
    if not state.store.exists(identity):  # deleted while this session was negotiated
        await session.close("identity deleted")
        raise HTTPException(404, str(IdentityNotFound(identity)))
    headers = {"Location": f"/v1/sessions/{session.id}"}
    if session.rtsp_url:
        headers["X-RTSP-URL"] = session.rtsp_url
    return Response(answer, status_code=201, media_type="application/sdp", headers=headers)


def owned_session(sessions: SessionManager, session_id: str, principal: Principal, access: Access) -> Session:
    """The session if `principal` may see it; another owner's answers 404 like a missing one."""
    try:
        session = sessions.get(session_id)
    except SessionNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    if not access.owners.visible(principal, session):
        raise HTTPException(404, str(SessionNotFound(session_id)))
    return session


@router.get("")
async def list_sessions(
    sessions: SessionsDep, principal: SessionsUser, access: AccessDep
) -> dict[str, list[dict[str, Any]]]:
    return {"sessions": [s.stats() for s in sessions.sessions() if access.owners.visible(principal, s)]}


@router.get("/{session_id}")
async def get_session(
    session_id: SessionId, sessions: SessionsDep, principal: SessionsUser, access: AccessDep
) -> dict[str, Any]:
    return owned_session(sessions, session_id, principal, access).stats()


@router.patch("/{session_id}")
async def switch_identity(
    session_id: SessionId,
    change: SwitchIdentity,
    state: StateDep,
    sessions: SessionsDep,
    principal: SessionsUser,
    access: AccessDep,
) -> dict[str, Any]:
    session = owned_session(sessions, session_id, principal, access)
    source = await load_identity(state, change.identity, principal)
    session.switch(change.identity, source)
    return session.stats()


@router.delete("/{session_id}", status_code=204)
async def delete_session(
    session_id: SessionId, sessions: SessionsDep, principal: SessionsUser, access: AccessDep
) -> Response:
    session = owned_session(sessions, session_id, principal, access)
    await session.close("deleted")
    return Response(status_code=204)
