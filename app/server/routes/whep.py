"""WHEP: a viewer POSTs an SDP offer (receive only) and pulls a session's or a stream's swapped output over
WebRTC.

201 with the SDP answer and `Location` (the viewer's resource); `DELETE` there stops it; `GET` on the
endpoint lists the viewers. Every viewer of an output shares one encode (`app.egress.whep`), a channel's viewers
the channel's own. Access is the
output's own: the `sessions` or `streams` scope and only the owner's outputs (admin: all), or a viewer token
minted for that output (`POST .../viewer-tokens`), which may open viewers and close the ones it opened, nothing
else. Each viewer records the credential that opened it: revoking that credential ends the viewer."""

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Request, Response

from app.auth.access import Access
from app.auth.guard import AccessDep, client_address
from app.auth.principal import Principal
from app.egress.whep import Viewer
from app.server.deps import StateDep
from app.server.limits import media_type, read_capped
from app.server.outputs import WATCHED_KINDS, OutputKind
from app.server.state import ServerState
from app.server.viewers import ViewerNotFound

router = APIRouter(tags=["whep"])

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


def stoppable_viewer(state: ServerState, key: str, viewer_id: str, principal: Principal, access: Access) -> Viewer:
    """The viewer to stop: any of the output's for its owner or admin, only its own for a viewer token."""
    viewer = state.viewers.get(key, viewer_id)
    ownership = access.owners.of(viewer)
    if principal.kind == "viewer" and (ownership is None or ownership.credential != principal.credential):
        raise ViewerNotFound(viewer_id)
    return viewer


def add_routes(kind: OutputKind) -> None:
    OutputId = Annotated[str, Path(alias=kind.param, min_length=1, max_length=64)]
    User = Annotated[Principal, kind.user()]
    Watcher = Annotated[Principal, kind.viewer()]

    @router.post(kind.path("/whep"), status_code=201, name=f"view_{kind.singular}")
    async def view(
        output_id: OutputId, request: Request, principal: Watcher, access: AccessDep, state: StateDep
    ) -> Response:
        """Body: the viewer's SDP offer (`Content-Type: application/sdp`, receive only, ICE gathering
        complete, H.264; an audio section gets the output's audio where it has some)."""
        output = kind.watched(state, output_id, principal, access)
        state.rate_limiter.hit("viewers", principal.id, client_address(request))
        offer = await read_offer(request, state)
        key = kind.key(output.id)
        viewer, answer = await state.viewers.add(
            key,
            offer,
            output.output_listeners,
            output.ended,
            output.audio_listeners,
            output.keyframe_listeners,
            output.encode,  # a channel's: its viewers take its packets
        )
        access.owners.set(viewer, principal)  # revoking the credential that opened it ends it
        location = f"/v1/{kind.plural}/{output.id}/whep/{viewer.id}"
        return Response(answer, status_code=201, media_type="application/sdp", headers={"Location": location})

    @router.get(kind.path("/whep"), name=f"{kind.singular}_viewers")
    async def listing(output_id: OutputId, principal: User, access: AccessDep, state: StateDep) -> dict[str, object]:
        hub = state.viewers.hub(kind.key(kind.watched(state, output_id, principal, access).id))
        return {
            "viewers": [v.stats() for v in hub.viewers()] if hub is not None else [],
            # Encoded by the viewers' own encode (a channel's, or a session's or stream's path, counts its own).
            "frames_encoded": hub.frames_encoded if hub is not None else 0,
            "frames_sent": hub.frames_sent if hub is not None else 0,
            "picture_delay_ms": hub.picture_delay_ms if hub is not None else 0.0,
        }

    @router.delete(kind.path("/whep/{viewer_id}"), name=f"stop_{kind.singular}_viewer")
    async def stop(
        output_id: OutputId, viewer_id: ViewerId, principal: Watcher, access: AccessDep, state: StateDep
    ) -> Response:
        output = kind.watched(state, output_id, principal, access)
        await stoppable_viewer(state, kind.key(output.id), viewer_id, principal, access).request_close()
        return Response(status_code=200)


for output_kind in WATCHED_KINDS:
    add_routes(output_kind)
