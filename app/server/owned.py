"""What a principal may use: its own identities, sessions and streams (admin: all). Another owner's resource is
"not found", exactly like a missing one, so ids cannot be probed for existence."""

import asyncio
from collections.abc import Callable
from typing import Protocol, TypeVar

from app.auth.access import Access
from app.auth.principal import Principal
from app.identity.store import IdentityNotFound, IdentityUnreadable
from app.media.webrtc import Session
from app.pipeline.swap import PreparedSource
from app.server.sessions import SessionManager, SessionNotFound
from app.server.state import ServerState
from app.server.streams import Stream, StreamManager, StreamNotFound


class Identified(Protocol):
    @property
    def id(self) -> str: ...


T = TypeVar("T", bound=Identified)


async def owned_source(state: ServerState, principal: Principal, identity_id: str) -> PreparedSource:
    """The identity prepared for the engine if `principal` may use it; `IdentityNotFound` otherwise."""
    await check_owned_identity(state, principal, identity_id)
    return await state.load_source(identity_id)


async def check_owned_identity(state: ServerState, principal: Principal, identity_id: str) -> None:
    """`IdentityNotFound` unless `principal` may use the identity."""
    try:
        identity = await asyncio.get_running_loop().run_in_executor(
            state.control_executor, state.store.get, identity_id
        )
    except IdentityUnreadable:
        if not principal.is_admin:  # damaged so that its owner cannot be read: only admin hears of it
            raise IdentityNotFound(identity_id) from None
        raise
    if not principal.can_see(identity.owner):
        raise IdentityNotFound(identity_id)


def owned_session(sessions: SessionManager, session_id: str, principal: Principal, access: Access) -> Session:
    """The session if `principal` owns it, is admin, or holds a viewer token for it (on the routes that take
    one); `SessionNotFound` otherwise."""
    return owned_output(sessions.get(session_id), "session", principal, access, SessionNotFound)


def owned_stream(streams: StreamManager, stream_id: str, principal: Principal, access: Access) -> Stream:
    return owned_output(streams.get(stream_id), "stream", principal, access, StreamNotFound)


def owned_output(
    output: T, kind: str, principal: Principal, access: Access, not_found: Callable[[str], LookupError]
) -> T:
    """`output` if `principal` may use it, else its kind's "not found", exactly as for a missing one."""
    if not (_still_watches(principal, f"{kind}/{output.id}", access) or access.owners.visible(principal, output)):
        raise not_found(output.id)
    return output


def _still_watches(principal: Principal, key: str, access: Access) -> bool:
    """A viewer token of `key` that is still held: finding the output may have revoked it since the request was
    authenticated (a channel deleted and made again on another replica, brought in by `ChannelManager.get`)."""
    token_id = principal.credential.removeprefix("viewer:")
    return principal.watches(key) and access.viewer_tokens.get(key, token_id) is not None
