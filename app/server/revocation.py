"""Owned live resources and their revocation: sessions, streams and WHEP viewers are registered with the
credential that opened them; deleting an identity ends every session and stream showing it, and revoking a key
ends everything opened with it: its sessions, streams, viewers, the viewer tokens it minted (with their
viewers) and the channels' pushes it added (stopped, and removed from the push store). A key that disappears
from the keys file (deleted by hand, or the whole file gone) counts as revoked. `StoredCredentials` tells the
push store's records, which outlive the process, whether their key may still run them.

A session ended this way stops sending at once: its output track is stopped before the close begins, so no
frame made with the revoked identity or credential leaves after the request that revoked it returned.
"""

import asyncio
import contextlib
import logging
from collections.abc import Callable

from app.auth.access import Access
from app.auth.keys import KeyStore
from app.auth.principal import LOCAL_ID, Principal
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


class StoredCredentials:
    """The credentials of stored pushes against the keys file (`app.server.pushes.Credentials`). JWTs and local
    mode have nothing to revoke: their pushes run while their owner's requests would."""

    def __init__(self, keys: KeyStore) -> None:
        self.keys = keys

    def valid(self, credential: str) -> bool:
        if credential == LOCAL_ID or credential.startswith("jwt:"):
            return True
        return credential in self.keys.active_ids()

    def of_owner(self, owner: str) -> str | None:
        """A record from before credentials were kept: its owner's only key ever, while active (another key of
        the name, revoked or not, could have added it); a JWT subject or local mode is its own credential."""
        if owner == LOCAL_ID or owner.startswith("jwt:"):
            return owner
        name = owner.removeprefix("key:")
        keys = [r for r in self.keys.records() if r.name == name] if owner.startswith("key:") else []
        return keys[0].id if len(keys) == 1 and keys[0].active else None


class RevocationWatcher:
    def __init__(self, state: ServerState, access: Access) -> None:
        self.state = state
        self.access = access
        self._task: asyncio.Task[None] | None = None
        self._audit_tasks: set[asyncio.Task[None]] = set()
        self._active: set[str] = set()
        self._pushes_left: set[str] = set()  # revoked keys whose pushes could not all be ended yet

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
            elif self._pushes_left:
                await self._end_pushes(set())

    # ------------------------------------------------------------------------------ registering

    def output_started(self, output: Session | Stream, principal: Principal) -> None:
        """Record who opened a session or stream (revoking that credential ends it) and audit its start; its
        viewer tokens are forgotten, and a session's end audited, when it ends."""
        kind = output.core.kind
        self.access.owners.set(output, principal)
        self.access.audit.event(
            f"{kind}_started",
            **{kind: output.id},
            owner=principal.id,
            credential=principal.credential,
            identity=output.identity_id,
            mark=output.marker.mark if output.marker else None,
        )
        task = asyncio.get_running_loop().create_task(self._when_ended(output, principal))
        task.set_name(f"{kind}-{output.id[:8]}-audit")
        self._audit_tasks.add(task)
        task.add_done_callback(self._audit_tasks.discard)

    async def _when_ended(self, output: Session | Stream, principal: Principal) -> None:
        await output.ended.wait()
        self.state.heap.soon()
        self.access.viewer_tokens.forget_output(f"{output.core.kind}/{output.id}")
        if isinstance(output, Session):  # a stream's end is audited where it is closed, with its reason
            self.access.audit.event(
                "session_ended",
                session=output.id,
                owner=principal.id,
                identity=output.identity_id,
                reason=output.close_reason,
            )

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
        await self._end_pushes(credentials)
        self.access.audit.event("key_revoked", key_ids=sorted(credentials), viewer_tokens=sorted(t.id for t in tokens))

    async def _end_pushes(self, credentials: set[str]) -> None:
        """The pushes added with these keys stop and are forgotten (audited as `push_ended`)."""
        channels = self.state.channels
        if channels is None or channels.pushes is None:
            return
        credentials = credentials | self._pushes_left
        try:
            await asyncio.to_thread(channels.pushes.end_credentials, channels.outputs(), credentials, KEY_REVOKED)
        except Exception:  # the push store cannot be written now: the next look at the keys tries again
            log.exception("the pushes of revoked keys %s could not all be ended", sorted(credentials))
            self._pushes_left = credentials
        else:
            self._pushes_left = set()

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
