"""WHEP viewers of the server's sessions: one `ViewerHub` per watched session, made at its first viewer
and closed with the session."""

import asyncio
import logging

from app.media.webrtc import Session
from app.media.whep import Viewer, ViewerHub

log = logging.getLogger(__name__)


class ViewerNotFound(LookupError):
    def __init__(self, viewer_id: str) -> None:
        super().__init__(f"viewer {viewer_id} not found")


class SessionViewers:
    def __init__(self, ice_servers: tuple[str, ...] = ()) -> None:
        self._ice_servers = ice_servers
        self._hubs: dict[str, ViewerHub] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    def hub(self, session_id: str) -> ViewerHub | None:
        return self._hubs.get(session_id)

    async def add(self, session: Session, offer: str) -> tuple[Viewer, str]:
        """A new viewer of `session`'s swapped output; returns it with the SDP answer."""
        hub = self._hubs.get(session.id)
        if hub is None:
            hub = ViewerHub(f"session {session.id[:8]}", asyncio.get_running_loop(), self._ice_servers)
            self._hubs[session.id] = hub
            session.output_listeners.append(hub.offer)
            task = asyncio.get_running_loop().create_task(self._close_with(session, hub))
            task.set_name(f"session-{session.id[:8]}-viewers")
            self._watchers.add(task)
            task.add_done_callback(self._watchers.discard)
        return await hub.add_viewer(offer)

    def get(self, session_id: str, viewer_id: str) -> Viewer:
        hub = self._hubs.get(session_id)
        viewer = hub.get(viewer_id) if hub is not None else None
        if viewer is None:
            raise ViewerNotFound(viewer_id)
        return viewer

    async def _close_with(self, session: Session, hub: ViewerHub) -> None:
        try:
            await session.closed.wait()
        finally:
            self._hubs.pop(session.id, None)
            await hub.close()

    async def close_all(self) -> None:
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
