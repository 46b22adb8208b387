"""A session's audio: on or off, and an extra offset for users who sync against a separate voice changer."""

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, Field, StrictBool, StrictInt

from app.auth.guard import AccessDep, SessionsUser
from app.media.audio_sync import MAX_OFFSET_MS
from app.server.deps import SessionsDep
from app.server.owned import owned_session

router = APIRouter(prefix="/v1/sessions", tags=["audio"])

SessionId = Annotated[str, Path(min_length=1, max_length=64)]


class AudioSettings(BaseModel):
    """Strict types: JSON `true` is not an offset of 1 ms, nor `1` a switch."""

    enabled: StrictBool | None = None
    # Added to the video's measured latency; the delay applied stays within 0 and 2 s (`GET` shows it).
    offset_ms: StrictInt | None = Field(None, ge=-MAX_OFFSET_MS, le=MAX_OFFSET_MS)


@router.get("/{session_id}/audio")
async def get_audio(
    session_id: SessionId, principal: SessionsUser, access: AccessDep, sessions: SessionsDep
) -> dict[str, Any]:
    return owned_session(sessions, session_id, principal, access).audio_stats()


@router.patch("/{session_id}/audio")
async def set_audio(
    session_id: SessionId, change: AudioSettings, principal: SessionsUser, access: AccessDep, sessions: SessionsDep
) -> dict[str, Any]:
    session = owned_session(sessions, session_id, principal, access)
    session.set_audio(change.enabled, change.offset_ms)
    return session.audio_stats()
