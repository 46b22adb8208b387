"""Owned live resources and their revocation: sessions, streams and WHEP viewers are registered with the
credential that opened them; deleting an identity ends every session and stream showing it, and revoking a key
ends everything opened with it: its sessions, streams, viewers and the viewer tokens it minted (with their
viewers). A key that disappears from the keys file (deleted by hand, or the whole file gone) counts as revoked.

A session ended this way stops sending at once: its output track is stopped before the close begins, so no
frame made with the revoked identity or credential leaves after the request that revoked it returned.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable

from app.auth.access import Access
from app.auth.principal import Principal
from app.auth.viewer_tokens import ViewerToken
from app.media.webrtc import Session
from app.pipeline.identity_map import identities_of
from app.server.state import ServerState
from app.server.streams import Stream

log = logging.getLogger(__name__)

KEYS_POLL_S = 0.5
CLOSE_WAIT_S = 5.0
IDENTITY_DELETED = "identity deleted"
KEY_REVOKED = "key revoked"
TOKEN_REVOKED = "viewer token revoked"


class RevocationWatcher:
    def __init__(self, state: ServerState, access: Access) -> None:
        self.state = state
        self.access = access
        self._task: asyncio.Task[None] | None = None
        self._audit_tasks: set[asyncio.Task[None]] = set()
        self._active: set[str] = set()

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        try:
            self._active = self.access.keys.active_ids()
        except Exception:  # an unreadable keys file refuses requests; the watcher tries again later
            log.warning("keys file unreadable; revocations wait until it can be read", exc_info=True)
        self._task = asyncio.get_running_loop().create_task(self._watch_keys(), name="access-revocation-watcher")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def _watch_keys(self) -> None:
        while True:
            await asyncio.sleep(KEYS_POLL_S)
            try:
                active = await asyncio.to_thread(self.access.keys.active_ids)
            except Exception:  # requests get 503 meanwhile; the reason is logged by the access checks
                continue
            # Revoked, or gone from the file: either way nothing it opened may go on.
            gone = self._active - active
            self._active = active
            if gone:
                await self.end_credentials(gone)

    # ------------------------------------------------------------------------------ registering

    def session_started(self, session: Session, principal: Principal) -> None:
        self.access.owners.set(session, principal)
        self.access.audit.event(
            "session_started",
            session=session.id,
            owner=principal.id,
            credential=principal.credential,
            identity=session.identity_id,
            mark=session.marker.mark if session.marker else None,
        )
        task = asyncio.get_running_loop().create_task(self._audit_end(session, principal))
        task.set_name(f"session-{session.id[:8]}-audit")
        self._audit_tasks.add(task)
        task.add_done_callback(self._audit_tasks.discard)

    async def _audit_end(self, session: Session, principal: Principal) -> None:
        await session.closed.wait()
        self.access.viewer_tokens.forget_output(f"session/{session.id}")
        self.access.audit.event(
            "session_ended",
            session=session.id,
            owner=principal.id,
            identity=session.identity_id,
            reason=session.close_reason,
        )

    def stream_started(self, stream: Stream, principal: Principal) -> None:
        self.access.owners.set(stream, principal)
        self.access.audit.event(
            "stream_started",
            stream=stream.id,
            owner=principal.id,
            credential=principal.credential,
            identity=stream.identity_id,
            mark=stream.marker.mark if stream.marker else None,
        )
        task = asyncio.get_running_loop().create_task(self._forget_tokens(stream))
        task.set_name(f"stream-{stream.id[:8]}-tokens")
        self._audit_tasks.add(task)
        task.add_done_callback(self._audit_tasks.discard)

    async def _forget_tokens(self, stream: Stream) -> None:
        await stream.ended.wait()
        self.access.viewer_tokens.forget_output(f"stream/{stream.id}")

    async def close_stream(self, stream: Stream, reason: str) -> None:
        streams = self.state.streams
        if streams is None:
            return
        publisher = stream.publisher
        if publisher is not None:  # stop the output first; the ingest worker may take a moment to stop
            await asyncio.to_thread(publisher.close)
        with contextlib.suppress(LookupError):
            await streams.close(stream.id)
        ownership = self.access.owners.of(stream)
        self.access.audit.event(
            "stream_ended",
            stream=stream.id,
            owner=ownership.owner if ownership else None,
            identity=stream.identity_id,
            reason=reason,
        )

    # ------------------------------------------------------------------------------ revoking

    async def identity_deleted(self, identity_id: str) -> None:
        def uses(resource: object) -> bool:
            if not isinstance(resource, Session | Stream):
                return False  # viewers end with their output
            return resource.identity_id == identity_id or identity_id in identities_of(resource.source)

        await self._end(uses, IDENTITY_DELETED)

    async def end_credentials(self, credentials: set[str]) -> None:
        """End everything opened with these credentials (key ids), including the viewer tokens they minted."""
        tokens = self.access.viewer_tokens.revoke_minted_by(credentials)
        await self._end_opened_with(credentials | {t.credential for t in tokens}, KEY_REVOKED)
        self.access.audit.event("key_revoked", key_ids=sorted(credentials), viewer_tokens=sorted(t.id for t in tokens))

    async def revoke_viewer_token(self, token: ViewerToken) -> None:
        """Revoke a viewer token; the viewers opened with it end before this returns."""
        self.access.viewer_tokens.revoke(token.id)
        await self._end_opened_with({token.credential}, TOKEN_REVOKED)
        self.access.audit.event("viewer_token_revoked", token_id=token.id, output=token.output)

    async def _end_opened_with(self, credentials: set[str], reason: str) -> None:
        def opened_with(resource: object) -> bool:
            ownership = self.access.owners.of(resource)
            return ownership is not None and ownership.credential in credentials

        await self._end(opened_with, reason)

    async def _end(self, matches: Callable[[object], bool], reason: str) -> None:
        closing: list[asyncio.Task[None]] = []
        for viewer in self.state.viewers.all():
            if matches(viewer):
                viewer.track.stop()  # no further frame leaves
                closing.append(viewer.request_close())
        if self.state.sessions is not None:
            for session in self.state.sessions.sessions():
                if matches(session):
                    session.output.stop()  # no further frame leaves, even one already being made
                    closing.append(session.request_close(reason))
        stream_closers = []
        if self.state.streams is not None:
            stream_closers = [self.close_stream(s, reason) for s in self.state.streams.streams() if matches(s)]
        if closing:
            await asyncio.wait(closing, timeout=CLOSE_WAIT_S)
        if stream_closers:
            await asyncio.gather(*stream_closers, return_exceptions=True)
