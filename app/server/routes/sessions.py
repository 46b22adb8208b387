"""WebRTC sessions, WHIP-style: POST an SDP offer, get the SDP answer; the swapped video comes back on it."""

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Request, Response

from app.auth.guard import AccessDep, SessionsUser, client_address
from app.identity.store import IdentityNotFound
from app.live.adapter import LiveRequest
from app.pipeline.identity_map import identities_of
from app.server.channels import CHANNEL_NAME_MAX
from app.server.deps import RevocationDep, SessionsDep, StateDep
from app.server.identity_maps import (
    MAX_MAP_ENTRIES,
    MIN_MATCH_THRESHOLD,
    parse_query_map,
    sources_for,
)
from app.server.limits import media_type, read_capped
from app.server.outputs import owned_channel
from app.server.owned import owned_session

router = APIRouter(prefix="/v1/sessions", tags=["sessions"])

SessionId = Annotated[str, Path(min_length=1, max_length=64)]


@router.post("", status_code=201)
async def create_session(
    request: Request,
    principal: SessionsUser,
    state: StateDep,
    sessions: SessionsDep,
    revocation: RevocationDep,
    access: AccessDep,
    identity: Annotated[str | None, Query(max_length=64)] = None,
    channel: Annotated[str | None, Query(min_length=1, max_length=CHANNEL_NAME_MAX)] = None,
    label: Annotated[bool | None, Query()] = None,
    map: Annotated[list[str] | None, Query(max_length=MAX_MAP_ENTRIES * 130)] = None,
    match_threshold: Annotated[float | None, Query(ge=MIN_MATCH_THRESHOLD, le=1.0)] = None,
) -> Response:
    """Body: the client's SDP offer (`Content-Type: application/sdp`, ICE gathering complete). `identity` swaps
    every face; or `map=PERSON:IDENTITY` (repeated) swaps each person's face with their identity and leaves other
    faces as they are (`match_threshold`: the cosine similarity a face needs to a person). `label=true` puts
    the visible "AI-generated" label on the output (the settings' default otherwise). `channel=NAME` publishes
    the swapped video into that channel of yours (its RTSP URL comes back in `X-RTSP-URL`), taking over from
    the session or stream that published there before, which is ended."""
    settings = state.settings
    state.rate_limiter.hit("sessions", principal.id, client_address(request))
    if media_type(request) != "application/sdp":
        raise HTTPException(415, "send the offer as application/sdp")
    body = await read_capped(request, settings.sdp_max_bytes)
    if not identity and not map:
        raise HTTPException(422, "query parameter `identity` (or `map`) is required")
    entries = parse_query_map(map) if map else None
    try:
        offer = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "the offer is not UTF-8 text") from None
    if "\x00" in offer:
        raise HTTPException(400, "the offer contains NUL characters")
    chosen, source = await sources_for(state, principal, None, identity or None, entries, match_threshold)
    target = owned_channel(state, channel, principal, access) if channel is not None else None
    wanted = LiveRequest(chosen, source, owner=principal.id, label=label, own_rtsp=target is None)
    session, answer = await sessions.open(offer, wanted)
    revocation.output_started(session, principal)
    for used in sorted({chosen} | identities_of(source)):
        if not state.store.exists(used):  # deleted while this session was negotiated
            await session.close("identity deleted")
            raise IdentityNotFound(used)
    headers = {"Location": f"/v1/sessions/{session.id}"}
    if target is not None:
        state.require_channels().attach(target, session, session.close)
        session.channel, session.rtsp_url = target.id, target.rtsp_url
        headers["X-Channel"] = target.id
    if session.rtsp_url:
        headers["X-RTSP-URL"] = session.rtsp_url
    return Response(answer, status_code=201, media_type="application/sdp", headers=headers)


@router.delete("/{session_id}", status_code=204)
async def delete_session(
    session_id: SessionId, principal: SessionsUser, sessions: SessionsDep, access: AccessDep
) -> Response:
    await owned_session(sessions, session_id, principal, access).close("deleted")
    return Response(status_code=204)
