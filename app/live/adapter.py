"""What every transport adapter of the live core exposes, read from its core: a WebRTC session and an RTSP
ingest stream are both a `LiveOutput` to the routes, the viewers and the revocation watcher."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import av

from app.live.core import LiveCore, OutputListener
from app.pipeline.identity_map import FaceSources
from app.provenance.service import FrameMarker

if TYPE_CHECKING:  # the egress reads the live core, never the reverse
    from app.egress.encode import SharedEncode

AudioListener = Callable[[av.AudioFrame, float], None]  # a frame and the monotonic instant it is due


@dataclass(frozen=True)
class LiveRequest:
    """What a client asked of a new session or stream, besides where its frames come from."""

    identity_id: str
    source: FaceSources
    owner: str = ""
    label: bool | None = None  # the visible "AI-generated" label; None: the settings decide
    own_rtsp: bool = True  # False when it publishes into a channel, which has the RTSP path


class Watchable(Protocol):
    """What a WHEP viewer needs of the output it watches (a session, a stream or a channel)."""

    @property
    def id(self) -> str: ...

    @property
    def ended(self) -> asyncio.Event: ...

    @property
    def output_listeners(self) -> list[OutputListener]: ...

    @property
    def audio_listeners(self) -> list[AudioListener] | None: ...

    @property
    def keyframe_listeners(self) -> list[Callable[[], None]] | None: ...

    @property
    def encode(self) -> SharedEncode | None:
        """The output's shared encode, whose packets its viewers take; None where they are encoded for them."""
        ...


class LiveOutput:
    """Mixed into an adapter that sets `id`, `core` and `ended` (set once the output is over for good)."""

    id: str
    core: LiveCore
    ended: asyncio.Event

    @property
    def identity_id(self) -> str:
        return self.core.identity_id

    @property
    def source(self) -> FaceSources:
        return self.core.source

    @property
    def marker(self) -> FrameMarker | None:
        return self.core.marker

    @marker.setter
    def marker(self, marker: FrameMarker | None) -> None:
        self.core.marker = marker

    @property
    def output_listeners(self) -> list[OutputListener]:
        """Called with every processed frame; each must return at once."""
        return self.core.output_listeners

    @property
    def audio_listeners(self) -> list[AudioListener] | None:
        """Where the output's audio goes, for outputs that carry audio; None for video-only ones."""
        return None

    @property
    def keyframe_listeners(self) -> list[Callable[[], None]] | None:
        """Called when the output's next frame should start on a keyframe; None where nothing asks for one."""
        return None

    @property
    def encode(self) -> SharedEncode | None:
        """None: a session's or a stream's viewers have their hub's own encode (`app.egress.whep`)."""
        return None

    def stats(self) -> dict[str, Any]:
        """What `GET` answers about the output (the core's figures and the transport's own)."""
        raise NotImplementedError

    def switch(self, identity_id: str, source: FaceSources) -> None:
        """Use another identity (or map) from the next frame on."""
        self.core.switch(identity_id, source)
