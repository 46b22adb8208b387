"""WHEP: a viewer POSTs an SDP offer (receive only) and pulls a session's or a stream's swapped output over
WebRTC.

201 with the SDP answer and `Location` (the viewer's resource); `DELETE` there stops it; `GET` on the
endpoint lists the viewers. Every viewer of an output shares one encode (`app.media.whep`). Access is the
output's own: the `sessions` or `streams` scope and only the owner's outputs (admin: all), or a viewer token
minted for that output (`POST .../viewer-tokens`), which may open viewers and close the ones it opened, nothing
else. Each viewer records the credential that opened it: revoking that credential ends the viewer."""

import asyncio
from collections.abc import Callable
from typing import Annotated

import av
from fastapi import APIRouter, HTTPException, Path, Request, Response

from app.auth.access import Access
from app.auth.guard import AccessDep, SessionsUser, SessionsViewer, StreamsUser, StreamsViewer, client_address
from app.auth.principal import Principal
from app.media.whep import Viewer
from app.pipeline.types import Image
from app.server.deps import SessionsDep, StateDep, StreamsDep
from app.server.limits import media_type, read_capped
from app.server.owned import owned_session, owned_stream
from app.server.state import ServerState
from app.server.viewers import ViewerNotFound

router = APIRouter(tags=["whep"])

OutputId = Annotated[str, Path(min_length=1, max_length=64)]
ViewerId = Annotated[str, Path(min_length=1, max_length=64)]


async def read_offer(request: Request, state: ServerState) -> str:
    if media_type(request) != "application/sdp":
        raise HTTPException(415, "send the offer as application/sdp")
    body = await read_capped(request, state.settings.sdp_max_bytes)
    try:
        offer = body.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(400, "the offer is not UTF-8 text") from None
    if not offer.startswith("v=0") or "\x00" in offer:
        raise HTTPException(400, "not an SDP offer: it must start with v=0")
    return offer


async def add_viewer(
    request: Request,
    state: ServerState,
    viewer_of: tuple[Principal, Access],
    kind: str,
    output_id: str,
    listeners: list[Callable[[Image], None]],
    ended: asyncio.Event,
    audio_listeners: list[Callable[[av.AudioFrame], None]] | None = None,
) -> Response:
    """Read the offer, join the output's shared encode, answer 201 with the viewer's `Location`."""
    principal, access = viewer_of
    state.rate_limiter.hit("viewers", principal.id, client_address(request))
    offer = await read_offer(request, state)
    viewer, answer = await state.viewers.add(f"{kind[:-1]}/{output_id}", offer, listeners, ended, audio_listeners)
    access.owners.set(viewer, principal)  # revoking the credential that opened it ends it
    location = f"/v1/{kind}/{output_id}/whep/{viewer.id}"
    return Response(answer, status_code=201, media_type="application/sdp", headers={"Location": location})


def stoppable_viewer(state: ServerState, key: str, viewer_id: str, principal: Principal, access: Access) -> Viewer:
    """The viewer to stop: any of the output's for its owner or admin, only its own for a viewer token."""
    viewer = state.viewers.get(key, viewer_id)
    ownership = access.owners.of(viewer)
    if principal.kind == "viewer" and (ownership is None or ownership.credential != principal.credential):
        raise ViewerNotFound(viewer_id)
    return viewer


def listing(state: ServerState, key: str) -> dict[str, object]:
    hub = state.viewers.hub(key)
    return {
        "viewers": [v.stats() for v in hub.viewers()] if hub is not None else [],
        "frames_encoded": hub.frames_encoded if hub is not None else 0,
    }


@router.post("/v1/sessions/{session_id}/whep", status_code=201)
async def view_session(
    session_id: OutputId,
    request: Request,
    principal: SessionsViewer,
    access: AccessDep,
    state: StateDep,
    sessions: SessionsDep,
) -> Response:
    """Body: the viewer's SDP offer (`Content-Type: application/sdp`, ICE gathering complete, H.264)."""
    session = owned_session(sessions, session_id, principal, access)
    return await add_viewer(
        request,
        state,
        (principal, access),
        "sessions",
        session.id,
        session.output_listeners,
        session.closed,
        session.audio.outputs,
    )


@router.get("/v1/sessions/{session_id}/whep")
async def session_viewers(
    session_id: OutputId, principal: SessionsUser, access: AccessDep, state: StateDep, sessions: SessionsDep
) -> dict[str, object]:
    return listing(state, f"session/{owned_session(sessions, session_id, principal, access).id}")


@router.delete("/v1/sessions/{session_id}/whep/{viewer_id}")
async def stop_session_viewer(
    session_id: OutputId,
    viewer_id: ViewerId,
    principal: SessionsViewer,
    access: AccessDep,
    state: StateDep,
    sessions: SessionsDep,
) -> Response:
    session = owned_session(sessions, session_id, principal, access)
    await stoppable_viewer(state, f"session/{session.id}", viewer_id, principal, access).request_close()
    return Response(status_code=200)


@router.post("/v1/streams/{stream_id}/whep", status_code=201)
async def view_stream(
    stream_id: OutputId,
    request: Request,
    principal: StreamsViewer,
    access: AccessDep,
    state: StateDep,
    streams: StreamsDep,
) -> Response:
    """Body: the viewer's SDP offer, as for sessions."""
    stream = owned_stream(streams, stream_id, principal, access)
    return await add_viewer(
        request, state, (principal, access), "streams", stream.id, stream.output_listeners, stream.ended
    )


@router.get("/v1/streams/{stream_id}/whep")
async def stream_viewers(
    stream_id: OutputId, principal: StreamsUser, access: AccessDep, state: StateDep, streams: StreamsDep
) -> dict[str, object]:
    return listing(state, f"stream/{owned_stream(streams, stream_id, principal, access).id}")


@router.delete("/v1/streams/{stream_id}/whep/{viewer_id}")
async def stop_stream_viewer(
    stream_id: OutputId,
    viewer_id: ViewerId,
    principal: StreamsViewer,
    access: AccessDep,
    state: StateDep,
    streams: StreamsDep,
) -> Response:
    stream = owned_stream(streams, stream_id, principal, access)
    await stoppable_viewer(state, f"stream/{stream.id}", viewer_id, principal, access).request_close()
    return Response(status_code=200)
