"""WHEP: a viewer POSTs an SDP offer (receive only) and pulls a session's swapped output over WebRTC.

201 with the SDP answer and `Location` (the viewer's resource); `DELETE` there stops it. Every viewer of a
session shares one encode (`app.media.whep`)."""

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response

from app.server.deps import SessionsDep, StateDep
from app.server.limits import media_type, read_capped

router = APIRouter(prefix="/v1/sessions", tags=["whep"])

SessionId = Annotated[str, Path(min_length=1, max_length=64)]
ViewerId = Annotated[str, Path(min_length=1, max_length=64)]


@router.post("/{session_id}/whep", status_code=201)
async def add_viewer(session_id: SessionId, request: Request, state: StateDep, sessions: SessionsDep) -> Response:
    """Body: the viewer's SDP offer (`Content-Type: application/sdp`, ICE gathering complete, H.264)."""
    if media_type(request) != "application/sdp":
        raise HTTPException(415, "send the offer as application/sdp")
    body = await read_capped(request, state.settings.sdp_max_bytes)
    try:
        offer = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "the offer is not UTF-8 text") from None
    if not offer.startswith("v=0") or "\x00" in offer:
        raise HTTPException(400, "not an SDP offer: it must start with v=0")
    session = sessions.get(session_id)
    viewer, answer = await state.viewers.add(session, offer)
    location = f"/v1/sessions/{session.id}/whep/{viewer.id}"
    return Response(answer, status_code=201, media_type="application/sdp", headers={"Location": location})


@router.get("/{session_id}/whep")
async def list_viewers(session_id: SessionId, state: StateDep, sessions: SessionsDep) -> dict[str, object]:
    sessions.get(session_id)
    hub = state.viewers.hub(session_id)
    viewers = hub.viewers() if hub is not None else []
    return {
        "viewers": [v.stats() for v in viewers],
        "frames_encoded": hub.frames_encoded if hub is not None else 0,
    }


@router.delete("/{session_id}/whep/{viewer_id}")
async def remove_viewer(session_id: SessionId, viewer_id: ViewerId, state: StateDep, sessions: SessionsDep) -> Response:
    sessions.get(session_id)
    await state.viewers.get(session_id, viewer_id).request_close()
    return Response(status_code=200)
