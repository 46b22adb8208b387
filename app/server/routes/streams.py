"""RTSP ingest streams: pull an RTSP camera (or, when allowed, a local file), publish the swapped video."""

import asyncio
from functools import partial
from pathlib import Path as FilePath
from typing import Annotated, Any
from urllib.parse import urlsplit

from fastapi import APIRouter, HTTPException, Path, Request, Response
from pydantic import Field

from app.auth.guard import AccessDep, StreamsUser, client_address
from app.live.adapter import LiveRequest
from app.media.rtsp_in import RtspTransport
from app.server.channels import CHANNEL_NAME_MAX
from app.server.deps import RevocationDep, StateDep, StreamsDep
from app.server.identity_maps import SourceChoice, sources_for
from app.server.ingest_policy import CheckedSource
from app.server.outputs import owned_channel
from app.server.owned import owned_stream
from app.server.settings import ServerSettings
from app.server.streams import StreamOrigin

router = APIRouter(prefix="/v1/streams", tags=["streams"])

StreamId = Annotated[str, Path(min_length=1, max_length=64)]


class StreamRequest(SourceChoice):
    """`source_url`, and `identity` for every face or `map` (`[{"person": ID, "identity": ID}]`) by person."""

    source_url: str = Field(min_length=1, max_length=2048)
    # How an rtsp:// source's media comes: interleaved on the RTSP connection (tcp, the default) or as RTP over
    # UDP to ports this server names (udp: less delay after a loss, but lost packets stay lost and NATs and
    # firewalls must let the datagrams in). Ignored for files.
    source_transport: RtspTransport = "tcp"
    label: bool | None = None  # the visible "AI-generated" label; the settings' default when not given
    # A channel of the caller's to publish into (taking over from its publisher), instead of a path of its own.
    channel: str | None = Field(None, min_length=1, max_length=CHANNEL_NAME_MAX)


def check_source(url: str, settings: ServerSettings) -> str:
    """The source to pull, or 422 with the reason: rtsp:// and rtsps:// URLs, local files only when allowed."""
    if any(ord(c) < 32 or ord(c) == 127 for c in url):
        raise HTTPException(422, "source_url contains control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise HTTPException(422, f"source_url is not a valid URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme in ("rtsp", "rtsps"):
        if not parts.hostname:
            raise HTTPException(422, "source_url has no host")
        if port == 0:
            raise HTTPException(422, "source_url has port 0")
        return url
    if scheme in ("", "file"):
        if not settings.allow_file_sources:
            raise HTTPException(422, "file sources are off on this server (SWAPCAST_ALLOW_FILE_SOURCES); use rtsp://")
        path = FilePath(parts.path if scheme == "file" else url)
        if not path.is_absolute():
            raise HTTPException(422, "a file source must be an absolute path")
        if not path.is_file():
            raise HTTPException(422, f"no such file: {path}")
        return str(path)
    raise HTTPException(422, f"unsupported source scheme {scheme!r}: use rtsp:// or rtsps://")


@router.post("", status_code=201)
async def create_stream(
    request: StreamRequest,
    http: Request,
    principal: StreamsUser,
    state: StateDep,
    streams: StreamsDep,
    revocation: RevocationDep,
    access: AccessDep,
    response: Response,
) -> dict[str, Any]:
    state.rate_limiter.hit("streams", principal.id, client_address(http))
    source_url = check_source(request.source_url, state.settings)
    streams.check_available()
    chosen, source = await sources_for(  # before probing anything for the request
        state, principal, None, request.identity, request.map, request.match_threshold
    )
    target = owned_channel(state, request.channel, principal, access) if request.channel is not None else None
    origin = StreamOrigin.of(source_url, await _checked(state, source_url), request.source_transport)
    stream = await streams.open(
        origin, LiveRequest(chosen, source, owner=principal.id, label=request.label, own_rtsp=target is None)
    )
    revocation.output_started(stream, principal)
    if target is not None:
        state.require_channels().attach(target, stream, partial(revocation.close_stream, stream))
        stream.rtsp_url = target.rtsp_url
        stream.channel = target.id
    response.headers["Location"] = f"/v1/streams/{stream.id}"
    return stream.stats()


async def _checked(state: StateDep, source_url: str) -> CheckedSource | None:
    """Live sources through the host policy (resolved once, off the event loop); none for local files."""
    if "://" not in source_url:
        return None
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(state.control_executor, state.ingest_policy.check_and_probe, source_url)


@router.post("/{stream_id}/restart")
async def restart_stream(
    stream_id: StreamId, principal: StreamsUser, state: StateDep, streams: StreamsDep, access: AccessDep
) -> dict[str, Any]:
    """Start a failed stream again, its source checked against the host policy again (its owner or admin only)."""
    stream = owned_stream(streams, stream_id, principal, access)
    checked = await _checked(state, stream.origin.requested_url)
    return (await streams.restart(stream_id, None if checked is None else checked.connect_url)).stats()


@router.delete("/{stream_id}", status_code=204)
async def delete_stream(
    stream_id: StreamId, principal: StreamsUser, streams: StreamsDep, access: AccessDep, revocation: RevocationDep
) -> Response:
    await revocation.close_stream(owned_stream(streams, stream_id, principal, access), "deleted")
    return Response(status_code=204)
