"""One published path: a shared media factory, so any number of clients pull the same encode.

A path's media (the pipeline) is built when its first client asks for it and then kept until the
path is unpublished or the server stops: gst-rtsp-server answers a client that comes while a shared
media is shutting down with "503 Service Unavailable", which a reconnecting OBS or ingest would hit.
A client that starts playing asks the encode for a keyframe, so it sees a picture at once rather
than at the next periodic one.

Every path reads a `SharedEncode` (`packet_feed`): it takes that encode's H.264 as it is and encodes nothing
itself. A path published with an encode (a channel's) serves it, and `push` does nothing: frames reach the
encode from its own producer. A path published without one (a session's or a stream's own) gets an
`OutputPath` of its own: `push` publishes into its feed, which holds the last frame while the producer pauses,
and its encode is there for the output's other readers (its WHEP viewers) too.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import TYPE_CHECKING, Any

import av
import numpy as np

from app.egress.path import OutputPath
from app.egress.rtsp.audio_feed import AudioFeed, audio_launch_fragment
from app.egress.rtsp.bindings import Bindings
from app.egress.rtsp.packet_feed import PacketFeed, packet_launch_description
from app.live.channel_feed import ChannelFeed
from app.live.frame import OutputFrame
from app.media.encoder import EncoderPolicy
from app.observability import Metrics
from app.pipeline.types import Image
from app.settings import EncoderSettings

if TYPE_CHECKING:
    from app.egress.encode import SharedEncode
    from app.egress.rtsp.server import RtspServer

log = logging.getLogger(__name__)

PRODUCER = "producer"  # the one publisher of a path's own feed


class RtspPublisher:
    """One published path: `push` frames, clients pull H.264 over RTSP.

    Its counters are its `feed`'s (plain ints, read without locking, as `PacketFeed` explains) and, for a path
    with its own encode, that encode's and its feed's. Frames pushed while no client is watching are not
    encoded.

    `push` keeps a reference to the array: do not modify it afterwards. The server tells the
    publisher about its clients through `set_watchers`, `client_started`, `release` and `shutdown`,
    never with its own lock held: GStreamer calls its signal handlers with its own locks held, and
    those handlers take this publisher's lock.
    """

    def __init__(
        self,
        server: RtspServer,
        gst: Bindings,
        path: str,
        width: int,
        height: int,
        fps: int,
        audio: bool = False,
        encoder: EncoderPolicy | None = None,
        encode: SharedEncode | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self.path = path
        self.width, self.height, self.fps = width, height, fps
        self.encoder = encoder or EncoderPolicy(EncoderSettings())
        # The path's own feed and encode when none is given; its producer's last frame is held while it pauses.
        self.own: OutputPath | None = None
        if encode is None:
            feed = ChannelFeed(path, width, height, fps, hold_s=math.inf)
            self.own = OutputPath(feed, self.encoder, metrics=metrics, kind="path")
            self.own.feed.attach(PRODUCER)
            encode = self.own.encode
        self._server = server
        self._gst = gst
        # Guards the media; taken before the feed's lock, never after it.
        self._lock = threading.Lock()
        self._media: Any = None
        self._held: Any = None  # the media this publisher keeps prepared
        self.encode: SharedEncode = encode
        self._feed = PacketFeed(gst, path, encode)
        # A second stream, Opus, when the path carries sound (`push_audio`).
        self._audio = AudioFeed(gst, path, self._audio_lead_s) if audio else None
        self.factory = self._make_factory()

    @property
    def has_audio(self) -> bool:
        return self._audio is not None

    @property
    def audio(self) -> AudioFeed | None:
        """The audio stream's feed and counters, when the path has one."""
        return self._audio

    def _audio_lead_s(self) -> float:
        """How much earlier than the video's timestamps the audio's must be for FFmpeg clients to play them
        together. The access unit delimiter that ends each frame (`feed`) starts the next access unit for
        FFmpeg's H.264 parser, which gives that access unit the timestamp of the packet it started in: every
        frame gets its predecessor's timestamp, one frame interval early. Measured with PyAV at 30, 15 and 5
        fps, audio pushed with the frames played 49, 94 and ~200 ms late before this correction."""
        return self._feed.frame_interval_s()

    def launch_description(self) -> str:
        video = packet_launch_description(self.width, self.height, self.fps)
        if self._audio is None:
            return video
        return f"{video[:-1]}{audio_launch_fragment()} )"

    def _make_factory(self) -> Any:
        factory = self._gst.GstRtspServer.RTSPMediaFactory.new()
        factory.set_launch(self.launch_description())
        factory.set_shared(True)
        factory.connect("media-configure", self._on_media_configure)
        return factory

    @property
    def feed(self) -> PacketFeed:
        """The path's video feed, with its counters (`packets_in`, `packets_sent`, `skipped`, `errors`,
        `dropped`) and state (`streaming`: a client plays the path; `closed`)."""
        return self._feed

    def push(self, image: Image | OutputFrame) -> None:
        """Offer the newest frame; returns at once. Frames of another shape are letterboxed. Nothing on a path
        that serves another's encode: its frames reach that encode from its own producer."""
        if self.own is None:
            return
        frame = OutputFrame.of(image)
        pixels = frame.image
        if pixels.ndim != 3 or pixels.shape[2] != 3 or pixels.dtype != np.uint8:
            raise ValueError(f"expected a BGR uint8 HxWx3 image, got {pixels.dtype} {pixels.shape}")
        self.own.feed.publish(PRODUCER, frame)

    def push_audio(self, frame: av.AudioFrame, due: float | None = None) -> None:
        """Audio due to play now (or at `due`, a `time.monotonic()` instant), in sync with the frame pushed
        then; returns at once. Ignored on a path published without audio."""
        if self._audio is not None:
            self._audio.offer(frame, due)

    def request_keyframe(self) -> None:
        """Ask the encoder to make the next frame a keyframe (with SPS/PPS)."""
        self._feed.request_keyframe()

    def close(self) -> None:
        """Stop publishing: the path disappears from the server and its clients are disconnected."""
        self._server.unpublish(self.path)

    # Called by the server.
    def set_watchers(self, count: int) -> None:
        """`count` clients play the path now."""
        self._feed.set_watchers(count)
        if self._audio is not None:
            self._audio.set_watchers(count)

    def client_started(self) -> None:
        """A client started playing: keyframes for it, and the media kept for the next one."""
        self._feed.client_started()
        with self._lock:
            media = self._media
        if media is not None:
            self._hold(media)

    def release(self) -> None:
        """Let the media go (the server stops, or the path is unpublished)."""
        with self._lock:
            media, self._held = self._held, None
        if media is not None:
            media.unprepare()

    def shutdown(self) -> None:
        """The path is unpublished: stop feeding and forget the media."""
        if not self._feed.close():
            return
        if self._audio is not None:
            self._audio.close()
        self.release()
        self._detach()
        self._feed.join(timeout=2.0)
        if self._audio is not None:
            self._audio.join(timeout=2.0)
        if self.own is not None:
            self.own.close()

    def _hold(self, media: Any) -> None:
        """Keep `media` prepared when its clients leave (see the module docstring)."""
        with self._lock:
            if self._held is media or self._feed.closed:
                return
            self._held = media
        if not media.prepare(None):
            with self._lock:
                if self._held is media:
                    self._held = None

    def _detach(self, media: Any = None) -> None:
        """Forget the current media (or only `media`, when given and still current)."""
        with self._lock:
            if media is not None and media is not self._media:
                return
            if self._held is self._media:
                self._held = None
            self._media = None
            self._feed.detach()
            if self._audio is not None:
                self._audio.detach()

    # GStreamer callbacks (client and media threads).
    def _on_media_configure(self, _factory: Any, media: Any) -> None:
        element = media.get_element()
        appsrc = element.get_by_name("src")
        media.connect("prepared", self._hold)
        media.connect("unprepared", self._on_media_unprepared)
        with self._lock:
            if not self._feed.attach(appsrc):
                return
            if self._audio is not None:
                self._audio.attach(element.get_by_name("asrc"))
            self._media = media
        log.debug("RTSP %s: media configured", self.path)

    def _on_media_unprepared(self, media: Any) -> None:
        self._detach(media)
        log.debug("RTSP %s: media released", self.path)
