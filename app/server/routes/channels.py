"""Channels: named outputs whose addresses never change. The owner creates one once, puts its RTSP URL (or its
viewer page) into OBS, and every session or stream that publishes into it (`channel=NAME`) shows there, with
the last frame held and then a slate in between. The RTSP login and the viewer token are shown when the
channel is created or rotated; the RTSP URL and the SRT URL (its passphrase is the RTSP password; both derived,
never stored) also on `GET`."""

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from app.auth.access import Access
from app.auth.guard import AccessDep, SessionsUser, client_address
from app.auth.principal import Principal
from app.server.channels import CHANNEL_NAME_MAX, Channel, ChannelManager
from app.server.deps import RevocationDep, StateDep
from app.server.outputs import owned_channel
from app.server.state import ServerState

router = APIRouter(prefix="/v1/channels", tags=["channels"])

ChannelName = Annotated[str, Path(min_length=1, max_length=CHANNEL_NAME_MAX)]


class ChannelRequest(BaseModel):
    """`name`: 1-63 lowercase letters, digits, `-` and `_` (it is the channel's address); the picture's size and
    rate default to the server's settings."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=CHANNEL_NAME_MAX)
    width: int | None = Field(None, ge=16, le=3840, multiple_of=2)
    height: int | None = Field(None, ge=16, le=2160, multiple_of=2)
    fps: int | None = Field(None, ge=1, le=60)


def describe(channels: ChannelManager, channel: Channel) -> dict[str, Any]:
    return {**channel.stats(channels.consumers(channel)), "rtsp_url": channel.rtsp_url, "srt_url": channel.srt_url}


def with_token(channels: ChannelManager, channel: Channel, token: str) -> dict[str, Any]:
    """The channel and its new viewer token, shown this once (the server keeps only its hash)."""
    view = describe(channels, channel)
    return {**view, "viewer_token": token, "view_url": f"{view['view_url']}?token={token}"}


def owned(state: ServerState, name: str, principal: Principal, access: Any) -> tuple[ChannelManager, Channel]:
    return state.require_channels(), owned_channel(state, name, principal, access)


def audit(access: Access, event: str, channel: Channel, principal: Principal, **fields: Any) -> None:
    """Channels send video out (and pushes to third parties): who made, rotated and deleted each is audited."""
    access.audit.event(
        event,
        channel=channel.id,
        owner=channel.owner,
        principal=principal.id,
        credential=principal.credential,
        **fields,
    )


@router.post("", status_code=201)
async def create_channel(
    body: ChannelRequest,
    request: Request,
    principal: SessionsUser,
    state: StateDep,
    access: AccessDep,
    response: Response,
) -> dict[str, Any]:
    """A new channel of yours. 409 when the name is taken or you hold your most channels (or the server its
    most); 422 for a picture larger or faster than the server's most."""
    channels = state.require_channels()
    state.rate_limiter.hit("credentials", principal.id, client_address(request))
    s = state.settings
    size = (body.width or s.channel_width, body.height or s.channel_height, body.fps or s.channel_fps)
    if size[0] * size[1] > s.max_channel_pixels or size[2] > s.max_channel_fps:
        # What the server encodes for the channel's consumers grows with its pixels and rate.
        raise HTTPException(
            422,
            f"a channel here is at most {s.max_channel_pixels} pixels (width x height) at {s.max_channel_fps} fps; "
            f"asked for {size[0]}x{size[1]} at {size[2]} fps",
        )
    channel, token = await state.run_control(channels.create, body.name, principal.id, *size)
    audit(access, "channel_created", channel, principal, width=size[0], height=size[1], fps=size[2])
    response.headers["Location"] = f"/v1/channels/{channel.id}"
    return with_token(channels, channel, token)


@router.get("")
async def list_channels(principal: SessionsUser, state: StateDep, access: AccessDep) -> dict[str, Any]:
    channels = state.require_channels()
    visible = [c for c in channels.outputs() if access.owners.visible(principal, c)]
    return {"channels": [describe(channels, c) for c in sorted(visible, key=lambda c: c.id)]}


@router.get("/{name}")
async def get_channel(name: ChannelName, principal: SessionsUser, state: StateDep, access: AccessDep) -> dict[str, Any]:
    channels, channel = owned(state, name, principal, access)
    return describe(channels, channel)


@router.post("/{name}/rotate")
async def rotate_channel(
    name: ChannelName,
    request: Request,
    principal: SessionsUser,
    state: StateDep,
    access: AccessDep,
    revocation: RevocationDep,
) -> dict[str, Any]:
    """A new RTSP password and viewer token; the old ones stop working and their clients are disconnected."""
    channels, channel = owned(state, name, principal, access)
    state.rate_limiter.hit("credentials", principal.id, client_address(request))
    old_token = channel.record.token
    channel, token = await state.run_control(channels.rotate, channel.id)
    await revocation.revoke_viewer_token(old_token)  # the WHEP viewers opened with it end now
    audit(access, "channel_rotated", channel, principal, generation=channel.record.generation)
    return with_token(channels, channel, token)


@router.delete("/{name}", status_code=204)
async def delete_channel(name: ChannelName, principal: SessionsUser, state: StateDep, access: AccessDep) -> Response:
    """Delete the channel: its consumers are disconnected and its publisher is ended."""
    channels, channel = owned(state, name, principal, access)
    await channels.delete(channel.id)
    audit(access, "channel_deleted", channel, principal)
    return Response(status_code=204)
