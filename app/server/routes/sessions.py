"""WebRTC sessions, WHIP-style: POST an SDP offer, get the SDP answer; the swapped video comes back on it."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, Field

from app.identity.store import IdentityNotFound, IdentityUnreadable
from app.media.advertise import advertise_host_candidates
from app.media.webrtc import AdmissionError, OfferError, SessionNotFound
from app.pipeline.swap import PreparedSource
from app.server.deps import SessionsDep, StateDep
from app.server.limits import media_type, read_capped
from app.server.state import NotReady, ServerState

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

SessionId = Annotated[str, Path(min_length=1, max_length=64)]


class SwitchIdentity(BaseModel):
    identity: str = Field(min_length=1, max_length=64)


async def load_identity(state: ServerState, identity_id: str) -> PreparedSource:
    """The prepared identity, or the HTTP error that explains why not."""
    try:
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
    source = await load_identity(state, identity)
    try:
        session, answer = await sessions.open(offer, identity, source)
    except AdmissionError as exc:
        raise HTTPException(503, str(exc), headers={"Retry-After": str(settings.retry_after_s)}) from None
    except OfferError as exc:
        raise HTTPException(400, str(exc)) from None
    if settings.advertised_address is not None:
        answer = advertise_host_candidates(answer, str(settings.advertised_address))
    headers = {"Location": f"/v1/sessions/{session.id}"}
    if session.rtsp_url:
        headers["X-RTSP-URL"] = session.rtsp_url
    return Response(answer, status_code=201, media_type="application/sdp", headers=headers)


@router.get("")
async def list_sessions(sessions: SessionsDep) -> dict[str, list[dict[str, Any]]]:
    return {"sessions": [s.stats() for s in sessions.sessions()]}


@router.get("/{session_id}")
async def get_session(session_id: SessionId, sessions: SessionsDep) -> dict[str, Any]:
    try:
        return sessions.get(session_id).stats()
    except SessionNotFound as exc:
        raise HTTPException(404, str(exc)) from None


@router.patch("/{session_id}")
async def switch_identity(
    session_id: SessionId, change: SwitchIdentity, state: StateDep, sessions: SessionsDep
) -> dict[str, Any]:
    try:
        session = sessions.get(session_id)
    except SessionNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    source = await load_identity(state, change.identity)
    session.switch(change.identity, source)
    return session.stats()


@router.delete("/{session_id}", status_code=204)
async def delete_session(session_id: SessionId, sessions: SessionsDep) -> Response:
    try:
        await sessions.close(session_id, "deleted")
    except SessionNotFound as exc:
        raise HTTPException(404, str(exc)) from None
    return Response(status_code=204)
