"""A session's occlusion: hands in front of the face kept (on) or the face pasted whole (off)."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path
from pydantic import BaseModel, StrictBool

from app.auth.guard import AccessDep, SessionsUser
from app.errors import UserError
from app.server.deps import SessionsDep
from app.server.owned import owned_session

router = APIRouter(prefix="/v1/sessions", tags=["occlusion"])

SessionId = Annotated[str, Path(min_length=1, max_length=64)]


class OcclusionSettings(BaseModel):
    enabled: StrictBool  # JSON true/false only


@router.get("/{session_id}/occlusion")
async def get_occlusion(
    session_id: SessionId, principal: SessionsUser, access: AccessDep, sessions: SessionsDep
) -> dict[str, Any]:
    """`enabled`: hands are kept in front of this session's faces; `available`: the server runs the stage."""
    return owned_session(sessions, session_id, principal, access).core.occlusion_stats()


@router.patch("/{session_id}/occlusion")
async def set_occlusion(
    session_id: SessionId, change: OcclusionSettings, principal: SessionsUser, access: AccessDep, sessions: SessionsDep
) -> dict[str, Any]:
    """Switch occlusion for this session from its next frame; 409 where the server runs without the stage."""
    core = owned_session(sessions, session_id, principal, access).core
    try:
        core.set_occlusion(change.enabled)
    except UserError as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None
    return core.occlusion_stats()
