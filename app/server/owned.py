"""What a principal may use: its own identities, sessions and streams (admin: all). Another owner's resource is
"not found", exactly like a missing one, so ids cannot be probed for existence."""

import asyncio

from app.auth.access import Access
from app.auth.principal import Principal
from app.identity.store import IdentityNotFound, IdentityUnreadable
from app.media.webrtc import Session
from app.pipeline.swap import PreparedSource
from app.server.sessions import SessionManager, SessionNotFound
from app.server.state import ServerState
from app.server.streams import Stream, StreamManager, StreamNotFound


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
    session = sessions.get(session_id)
    if not (principal.watches(f"session/{session.id}") or access.owners.visible(principal, session)):
        raise SessionNotFound(session_id)
    return session


def owned_stream(streams: StreamManager, stream_id: str, principal: Principal, access: Access) -> Stream:
    stream = streams.get(stream_id)
    if not (principal.watches(f"stream/{stream.id}") or access.owners.visible(principal, stream)):
        raise StreamNotFound(stream_id)
    return stream
