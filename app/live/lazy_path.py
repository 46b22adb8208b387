"""`LazyPath`: a live output's own RTSP path, published at the output's first frame, when its size is known.

A session learns its output size from its first processed frame, an RTSP-ingest stream from its source's first
open; both hold one of these. The path is an extra beside the output's main reader (the WebRTC return, the
stream's own processing): a path that cannot be published, or whose push fails, is logged and given up, and the
output goes on without it. The opener is injected (the server's RTSP output), so the live core imports no egress.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

import av

from app.live.frame import OutputFrame
from app.pipeline.types import Image

if TYPE_CHECKING:
    from app.egress.encode import SharedEncode

log = logging.getLogger(__name__)


class PathPublisher(Protocol):
    """What publishing a path gives back (`app.server.rtsp.FramePublisher` is one)."""

    @property
    def encode(self) -> SharedEncode: ...

    def push(self, image: Image | OutputFrame) -> None: ...

    def push_audio(self, frame: av.AudioFrame, due: float | None = None) -> None: ...

    def close(self) -> None: ...


# (width, height, audio) -> the published path; may block (the RTSP server builds the path's pipeline)
OpenPath = Callable[[int, int, bool], PathPublisher]


class LazyPath:
    def __init__(self, open_path: OpenPath | None, owner: str) -> None:
        """`open_path` None: the output has no path of its own (RTSP is off, or it publishes into a channel, which
        has the path); every call is then a no-op. `owner` names the output in the log ("session 3f2a...")."""
        self._open_path = open_path
        self._owner = owner
        self._lock = threading.Lock()  # a stream opens from its ingest thread while the server may close it
        self._publisher: PathPublisher | None = None
        self._ended = open_path is None  # given up or closed: never opened again

    @property
    def published(self) -> bool:
        return self._publisher is not None

    @property
    def given_up(self) -> bool:
        """No path now and none to come (no opener, a failed publish or push, or closed)."""
        return self._ended

    @property
    def encode(self) -> SharedEncode | None:
        """The path's shared encode once it is published (the output's WHEP viewers read it too)."""
        publisher = self._publisher
        return publisher.encode if publisher is not None else None

    def open(self, width: int, height: int, audio: bool = False) -> bool:
        """Publish the path at `width`x`height` (with an audio stream fed by `push_audio` when `audio`) unless it
        is already; whether it is published now. Blocks while the path is built: an event loop calls it in an
        executor."""
        with self._lock:
            if self._publisher is not None:
                return True
            if self._ended or self._open_path is None:
                return False
            try:
                self._publisher = self._open_path(width, height, audio)
            except Exception:  # RTSP is an extra: the output goes on without it
                log.exception("%s: cannot publish its RTSP path; going on without it", self._owner)
                self._ended = True
                return False
            return True

    def push(self, image: Image | OutputFrame) -> None:
        """Hand the path a frame, publishing it at this frame's size first if it is not yet."""
        publisher = self._publisher
        if publisher is None:
            if self._ended or not self.open(*OutputFrame.of(image).size):
                return
            publisher = self._publisher
            if publisher is None:  # closed meanwhile
                return
        try:
            publisher.push(image)
        except Exception:  # never let the RTSP side end the output
            log.exception("%s: RTSP push failed; the path is given up", self._owner)
            self.close()

    def push_audio(self, frame: av.AudioFrame, due: float | None = None) -> None:
        publisher = self._publisher
        if publisher is not None:
            publisher.push_audio(frame, due)

    def close(self) -> None:
        """Unpublish the path (its clients are disconnected); it is not published again."""
        with self._lock:
            self._ended = True
            publisher, self._publisher = self._publisher, None
        if publisher is not None:
            try:
                publisher.close()
            except Exception:  # closing must finish; the error is only logged
                log.exception("%s: RTSP path did not close cleanly", self._owner)
