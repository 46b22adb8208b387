"""A channel's pushes: its picture and sound sent on to platforms and servers (RTMP/RTMPS, SRT, WHIP). Only the
channel's owner (or an admin) sees and manages them. Stream keys, Bearer tokens and SRT passphrases go in once
and are never shown again: the URL comes back with each secret as `***`."""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field

from app.auth.guard import AccessDep, SessionsUser, client_address
from app.egress.push_destination import URL_MAX, Destination
from app.server.deps import StateDep
from app.server.pushes import PushManager
from app.server.routes.channels import ChannelName, owned
from app.server.state import ServerState

router = APIRouter(prefix="/v1/channels", tags=["pushes"])

PushId = Annotated[str, Path(min_length=1, max_length=32)]


class PushRequest(BaseModel):
    """`url`: `rtmp://HOST/APP[/KEY]` or `rtmps://...` (FLV, H.264 + AAC), `srt://HOST:PORT` (MPEG-TS; `mode`
    caller or listener, `latency_ms`, `passphrase`, `streamid`, in the query or here) or an `http(s)://` WHIP
    endpoint (H.264 + Opus). `key`: the RTMP stream key (when not in the URL) or the WHIP Bearer token."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(min_length=1, max_length=URL_MAX)
    key: str | None = Field(None, max_length=512)
    passphrase: str | None = Field(None, max_length=512)
    streamid: str | None = Field(None, max_length=512)
    mode: Literal["caller", "listener"] | None = None
    latency_ms: int | None = Field(None, ge=20, le=10000)


def manager(state: ServerState) -> PushManager:
    channels = state.require_channels()
    assert channels.pushes is not None  # the server always makes one
    return channels.pushes


@router.post("/{name}/pushes", status_code=201)
async def add_push(
    name: ChannelName,
    body: PushRequest,
    request: Request,
    principal: SessionsUser,
    state: StateDep,
    access: AccessDep,
    response: Response,
) -> dict[str, Any]:
    """A new push of your channel; it connects at once and reconnects by itself, and ends when the key that
    added it is revoked. 422 for a URL it cannot use, 409 when the channel has its most pushes, 503 when the
    server runs its most."""
    _, channel = owned(state, name, principal, access)
    state.rate_limiter.hit("credentials", principal.id, client_address(request))
    destination = Destination.parse(
        body.url,
        key=body.key,
        passphrase=body.passphrase,
        streamid=body.streamid,
        mode=body.mode,
        latency_ms=body.latency_ms,
    )
    # The destination policy, before anything connects: 422 with the reason (app.egress.push_policy).
    destination = await state.run_control(state.push_policy.check, destination)
    push = await state.run_control(manager(state).add, channel, principal.id, destination, principal.credential)
    response.headers["Location"] = f"/v1/channels/{channel.id}/pushes/{push['id']}"
    return push


@router.get("/{name}/pushes")
async def list_pushes(name: ChannelName, principal: SessionsUser, state: StateDep, access: AccessDep) -> dict[str, Any]:
    _, channel = owned(state, name, principal, access)
    return {"pushes": await state.run_control(manager(state).list, channel)}


@router.get("/{name}/pushes/{push_id}")
async def get_push(
    name: ChannelName, push_id: PushId, principal: SessionsUser, state: StateDep, access: AccessDep
) -> dict[str, Any]:
    """The push: its destination (secrets hidden), state, bitrate, reconnects and last error."""
    _, channel = owned(state, name, principal, access)
    return await state.run_control(manager(state).get, channel, push_id)


@router.delete("/{name}/pushes/{push_id}", status_code=204)
async def delete_push(
    name: ChannelName, push_id: PushId, principal: SessionsUser, state: StateDep, access: AccessDep
) -> Response:
    """Stop the push and forget it (its key with it)."""
    _, channel = owned(state, name, principal, access)
    await state.run_control(manager(state).remove, channel, push_id, principal.id)
    return Response(status_code=204)
