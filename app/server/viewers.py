"""WHEP viewers of the server's sessions, streams and channels: one `ViewerHub` per watched output, made at its
first viewer, fed by the output's listeners (a channel's: by the channel's shared encode, whose packets it reads)
and closed when the output ends; at most `max_per_output` viewers each (those still negotiating count)."""

import asyncio
import logging
from collections import Counter
from collections.abc import Callable

from app.egress.encode import SharedEncode
from app.egress.whep import Viewer, ViewerHub
from app.live.adapter import AudioListener
from app.live.core import OutputListener
from app.media.encoder import EncoderPolicy
from app.media.peer import PeerConfig
from app.server.admission import AdmissionError
from app.server.resource_errors import NotFound

log = logging.getLogger(__name__)


class ViewerNotFound(NotFound):
    what = "viewer"


class ViewerTokenNotFound(NotFound):
    what = "viewer token"


class Viewers:
    """Hubs by output key (`session/ID`, `stream/ID`)."""

    def __init__(
        self,
        peer: PeerConfig | None = None,
        max_per_output: int = 8,
        encoder: EncoderPolicy | None = None,
        on_hub_closed: Callable[[], None] | None = None,
    ) -> None:
        """`on_hub_closed`: called once an output's viewers and their encoder have all been closed."""
        self._on_hub_closed = on_hub_closed
        self._peer = peer or PeerConfig()
        self._encoder = encoder
        self._max_per_output = max_per_output
        self._joining: Counter[str] = Counter()  # viewers being negotiated, by output key
        self._hubs: dict[str, ViewerHub] = {}
        self._watchers: set[asyncio.Task[None]] = set()

    def hub(self, key: str) -> ViewerHub | None:
        return self._hubs.get(key)

    def count(self, key: str) -> int:
        """Viewers of the output `key` now."""
        hub = self._hubs.get(key)
        return len(hub.viewers()) if hub is not None else 0

    async def add(
        self,
        key: str,
        offer: str,
        listeners: list[OutputListener],
        ended: asyncio.Event,
        audio_listeners: list[AudioListener] | None = None,
        keyframe_listeners: list[Callable[[], None]] | None = None,
        encode: SharedEncode | None = None,
    ) -> tuple[Viewer, str]:
        """A new viewer of the output `key`, whose frames go to `listeners` (its audio, if it has some, to
        `audio_listeners`) and which ends with `ended`; given the output's `encode`, the viewers take its packets
        instead, and the frame and keyframe listeners are left alone. `AdmissionError` (503) when the output has
        its most."""
        hub = self._hubs.get(key)
        held = (len(hub.viewers()) if hub is not None else 0) + self._joining[key]
        if held >= self._max_per_output:
            raise AdmissionError(f"{key} has {held} viewers, the most one output may have")
        if hub is None:
            loop = asyncio.get_running_loop()
            hub = self._hubs[key] = ViewerHub(key, loop, self._peer, self._encoder, encode)
            if encode is None:
                listeners.append(hub.offer)
                if keyframe_listeners is not None:
                    keyframe_listeners.append(hub.request_keyframe)
            if audio_listeners is not None:
                audio_listeners.append(hub.offer_audio)
            task = loop.create_task(self._close_with(key, hub, listeners, ended, audio_listeners, keyframe_listeners))
            task.set_name(f"viewers-{key}")
            self._watchers.add(task)
            task.add_done_callback(self._watchers.discard)
        self._joining[key] += 1
        try:
            return await hub.add_viewer(offer)
        finally:
            self._joining[key] -= 1
            if not self._joining[key]:
                del self._joining[key]

    def all(self) -> list[Viewer]:
        return [viewer for hub in list(self._hubs.values()) for viewer in hub.viewers()]

    def get(self, key: str, viewer_id: str) -> Viewer:
        hub = self._hubs.get(key)
        viewer = hub.get(viewer_id) if hub is not None else None
        if viewer is None:
            raise ViewerNotFound(viewer_id)
        return viewer

    async def _close_with(
        self,
        key: str,
        hub: ViewerHub,
        listeners: list[OutputListener],
        ended: asyncio.Event,
        audio_listeners: list[AudioListener] | None,
        keyframe_listeners: list[Callable[[], None]] | None,
    ) -> None:
        try:
            await ended.wait()
        finally:
            if keyframe_listeners is not None and hub.request_keyframe in keyframe_listeners:
                keyframe_listeners.remove(hub.request_keyframe)
            if self._hubs.get(key) is hub:  # a new output under the same key (a channel made again) has its own
                del self._hubs[key]
            if hub.offer in listeners:
                listeners.remove(hub.offer)
            if audio_listeners is not None and hub.offer_audio in audio_listeners:
                audio_listeners.remove(hub.offer_audio)
            await hub.close()
            if self._on_hub_closed is not None:
                self._on_hub_closed()

    async def close_all(self) -> None:
        for task in list(self._watchers):
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
