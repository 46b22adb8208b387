"""WebRTC sessions, WHIP-style: POST an SDP offer, get the SDP answer; the swapped video comes back on it."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, Field

from app.server.deps import SessionsDep, StateDep
from app.server.limits import media_type, read_capped
from app.server.principal import principal_of

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

SessionId = Annotated[str, Path(min_length=1, max_length=64)]


class SwitchIdentity(BaseModel):
    identity: str = Field(min_length=1, max_length=64)


@router.post("", status_code=201)
async def create_session(
    request: Request,
    state: StateDep,
    sessions: SessionsDep,
    identity: Annotated[str | None, Query(max_length=64)] = None,
    label: Annotated[bool | None, Query()] = None,
) -> Response:
    """Body: the client's SDP offer (`Content-Type: application/sdp`, ICE gathering complete). `label=true`
    puts the visible "AI-generated" label on the output (the settings' default otherwise)."""
    settings = state.settings
    state.rate_limiter.hit("sessions", request)
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
    source = await state.load_source(identity)
    session, answer = await sessions.open(offer, identity, source, principal_of(request), label=label)
    headers = {"Location": f"/v1/sessions/{session.id}"}
    if session.rtsp_url:
        headers["X-RTSP-URL"] = session.rtsp_url
    return Response(answer, status_code=201, media_type="application/sdp", headers=headers)


@router.get("")
async def list_sessions(sessions: SessionsDep) -> dict[str, list[dict[str, Any]]]:
    return {"sessions": [s.stats() for s in sessions.sessions()]}


@router.get("/{session_id}")
async def get_session(session_id: SessionId, sessions: SessionsDep) -> dict[str, Any]:
    return sessions.get(session_id).stats()


@router.patch("/{session_id}")
async def switch_identity(
    session_id: SessionId, change: SwitchIdentity, state: StateDep, sessions: SessionsDep
) -> dict[str, Any]:
    session = sessions.get(session_id)
    source = await state.load_source(change.identity)
    session.switch(change.identity, source)
    return session.stats()


@router.delete("/{session_id}", status_code=204)
async def delete_session(session_id: SessionId, sessions: SessionsDep) -> Response:
    await sessions.close(session_id, "deleted")
    return Response(status_code=204)
