"""RTSP output that OBS, ffmpeg or VLC can pull: an embedded gst-rtsp-server.

Each published path is a shared media factory, so any number of clients pull the same encode.
A publisher keeps only the newest frame handed to `RtspPublisher.push`; a feeder thread turns it
into I420 and hands it to the pipeline

    appsrc (live, timestamped on arrival) → x264enc (zerolatency, ultrafast) → rtph264pay

`config-interval=1` repeats SPS/PPS every second: with x264's sliced threads the alternative
(`-1`) gives clients corrupt frames. A client that starts playing asks the encoder for a
keyframe, so it sees a picture at once rather than at the next periodic one.

FFmpeg-based clients (OBS's media source, ffmpeg, PyAV) find the end of an H.264 frame only when
the next NAL that cannot belong to it arrives, which normally is the next frame: one frame
interval (33 ms at 30 fps) of delay on top of everything else. So each encoded frame is followed
at once by an access unit delimiter (x264's own leading ones are switched off), which tells those
parsers the frame is complete. Measured over loopback at 640x480@30 this takes the push-to-decoded
latency from ~37 ms to ~4 ms; `aud_after_frame=False` in `RtspServer.publish` turns it off.

A path's media (the pipeline) is built when its first client asks for it and then kept until
the path is unpublished or the server stops: gst-rtsp-server answers a client that comes while a
shared media is shutting down with "503 Service Unavailable", which a reconnecting OBS or ingest
would hit. While no client plays the path, frames pushed are dropped at once, before any
conversion, and the encoder is idle. A media answers a client's DESCRIBE only once its first
frame is encoded, and FFmpeg probes ~20 frames before it returns from opening a stream and then
decodes nothing before a keyframe; so a media starts from the last frame pushed (black if there
was none), a client that starts playing gets keyframes at once and 0.5 s and 1 s later, and when
no new frame has come for two frame intervals the last one is sent again at the announced rate,
as a camera would. Clients connect promptly to a paused producer and their read timeouts do not
fire while it pauses.

GStreamer and PyGObject are imported on first use:
without them the package still imports, `RtspServer.available` is False and
`RtspServer.unavailable_reason` says what to install.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from app.errors import UserError
from app.pipeline.types import Image

log = logging.getLogger(__name__)

APT_PACKAGES = (
    "gir1.2-gst-rtsp-server-1.0 gir1.2-gst-plugins-base-1.0 gstreamer1.0-plugins-base "
    "gstreamer1.0-plugins-good gstreamer1.0-plugins-ugly"
)
PYGOBJECT_HINT = (
    "apt-get install libgirepository1.0-dev libcairo2-dev pkg-config gcc, then pip install 'PyGObject<3.51'"
)

# Elements every published path needs, and the Debian package that ships each.
_REQUIRED_ELEMENTS = {
    "appsrc": "gstreamer1.0-plugins-base",
    "x264enc": "gstreamer1.0-plugins-ugly",
    "rtph264pay": "gstreamer1.0-plugins-good",
}

_PATH_RE = re.compile(r"^(/[A-Za-z0-9._~-]+)+$")

# Frames the appsrc may hold while the encoder is busy; older ones are dropped beyond that.
_APPSRC_MAX_BUFFERS = 2

# After a client starts playing, the encoder is asked for keyframes this long after: at once for
# clients that keep what they read while probing the stream, later for those that drop it.
_KEYFRAMES_AFTER_PLAY_S = (0.0, 0.5, 1.0)

# How long a frame waits for a new media's pipeline to start playing before it is dropped.
_START_TIMEOUT_S = 2.0

# An H.264 access unit delimiter NAL (primary_pic_type 7: any slice type), with its start code.
_AUD = b"\x00\x00\x00\x01\x09\xf0"


@dataclass(frozen=True)
class _Bindings:
    """The GObject-introspection modules this file uses (untyped, so kept in one place)."""

    Gst: Any
    GLib: Any
    GstRtspServer: Any
    GstVideo: Any


_bindings_lock = threading.Lock()
_bindings: tuple[_Bindings | None, str | None] | None = None


def _import_bindings() -> tuple[_Bindings | None, str | None]:
    try:
        import gi
    except ImportError:
        return None, f"PyGObject is not installed: {PYGOBJECT_HINT}"
    try:
        gi.require_version("Gst", "1.0")
        gi.require_version("GstRtspServer", "1.0")
        gi.require_version("GstVideo", "1.0")
        from gi.repository import GLib, Gst, GstRtspServer, GstVideo
    except (ImportError, ValueError) as exc:
        return None, f"GStreamer RTSP bindings not installed ({exc}): apt-get install {APT_PACKAGES}"
    try:
        ok, _argv = Gst.init_check(None)
    except GLib.Error as exc:
        return None, f"GStreamer failed to initialise: {exc.message}"
    if not ok:
        return None, "GStreamer failed to initialise"
    missing = [name for name in _REQUIRED_ELEMENTS if Gst.ElementFactory.find(name) is None]
    if missing:
        packages = " ".join(sorted({_REQUIRED_ELEMENTS[name] for name in missing}))
        return None, f"GStreamer elements missing ({', '.join(missing)}): apt-get install {packages}"
    return _Bindings(Gst=Gst, GLib=GLib, GstRtspServer=GstRtspServer, GstVideo=GstVideo), None


def _load_bindings() -> tuple[_Bindings | None, str | None]:
    global _bindings
    with _bindings_lock:
        if _bindings is None:
            _bindings = _import_bindings()
        return _bindings


def rtsp_unavailable_reason() -> str | None:
    """Why RTSP cannot be served on this machine, or None when it can."""
    return _load_bindings()[1]


def _require_bindings() -> _Bindings:
    gst, reason = _load_bindings()
    if gst is None:
        raise UserError(f"RTSP is not available: {reason}")
    return gst


def normalise_path(path: str) -> str:
    """`"obs"` and `"/obs/"` both become `"/obs"`; `UserError` for anything that is not a plain URL path."""
    p = "/" + path.strip("/")
    if not _PATH_RE.match(p):
        raise UserError(f"invalid RTSP path {path!r}: use letters, digits and . _ ~ - separated by /")
    return p


def default_bitrate_kbps(width: int, height: int, fps: int) -> int:
    """About 0.1 bit per pixel: ~0.9 Mbit/s at 640x480@30, ~2.8 at 720p30, ~6.2 at 1080p30."""
    return max(500, round(width * height * fps * 0.1 / 1000))


class RtspPublisher:
    """One published path: `push` frames, clients pull H.264 over RTSP.

    Counters (plain ints, read without locking):
    * ``frames_pushed``: every frame handed to `push`;
    * ``frames_sent``: frames handed to the encoder;
    * ``dropped``: frames replaced by a newer one before the feeder took them, or pushed out of
      the appsrc's short queue by a newer one while the encoder was busy;
    * ``frames_repeated``: frames sent that were not fresh from `push`: a new media's first frame
      and repeats while no new frame comes (see the module docstring);
    * ``errors``: frames that could not be converted or handed to the encoder (logged once).
    Frames pushed while no client is watching are neither sent nor dropped.

    `push` keeps a reference to the array: do not modify it afterwards.
    """

    def __init__(
        self,
        server: RtspServer,
        gst: _Bindings,
        path: str,
        width: int,
        height: int,
        fps: int,
        bitrate_kbps: int,
        aud_after_frame: bool,
    ) -> None:
        self.path = path
        self.width = width
        self.height = height
        self.fps = fps
        self.bitrate_kbps = bitrate_kbps
        self.aud_after_frame = aud_after_frame
        self.frames_pushed = 0
        self.frames_sent = 0
        self.dropped = 0
        self.frames_repeated = 0
        self.errors = 0
        self._server = server
        self._gst = gst
        self._cond = threading.Condition()
        self._pending: Image | None = None
        self._last: Image | None = None  # the newest frame pushed, streaming or not
        self._prime = False  # a new media waits for its first frame
        self._appsrc: Any = None
        self._encoder: Any = None
        self._media: Any = None
        self._held: Any = None  # the media this publisher keeps prepared
        self._watchers = 0  # clients playing the path
        self._keyframes_due: list[float] = []
        self._closed = False
        self.factory = self._make_factory()
        self._feeder = threading.Thread(target=self._feed, name=f"rtsp-feed{path}", daemon=True)
        self._feeder.start()

    def launch_description(self) -> str:
        caps = f"video/x-raw,format=I420,width={self.width},height={self.height},framerate={self.fps}/1"
        return (
            f"( appsrc name=src is-live=true do-timestamp=true format=time "
            f"max-buffers={_APPSRC_MAX_BUFFERS} leaky-type=downstream caps={caps} "
            f"! x264enc name=enc tune=zerolatency speed-preset=ultrafast bitrate={self.bitrate_kbps} "
            f"key-int-max={2 * self.fps} aud={'false' if self.aud_after_frame else 'true'} "
            f"! video/x-h264,stream-format=byte-stream,alignment=au,profile=constrained-baseline "
            f"! rtph264pay name=pay0 pt=96 config-interval=1 )"
        )

    def _make_factory(self) -> Any:
        factory = self._gst.GstRtspServer.RTSPMediaFactory.new()
        factory.set_launch(self.launch_description())
        factory.set_shared(True)
        factory.connect("media-configure", self._on_media_configure)
        return factory

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def streaming(self) -> bool:
        """True while at least one client plays the path (frames pushed now get encoded)."""
        return self._watchers > 0 and self._appsrc is not None

    def push(self, image: Image) -> None:
        """Offer the newest frame; returns at once. Frames of another size are resized."""
        if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
            raise ValueError(f"expected a BGR uint8 HxWx3 image, got {image.dtype} {image.shape}")
        with self._cond:
            self.frames_pushed += 1
            self._last = image
            if self._watchers == 0 or self._appsrc is None or self._closed:
                return
            if self._pending is not None:
                self.dropped += 1
            self._pending = image
            self._cond.notify()

    def request_keyframe(self) -> None:
        """Ask the encoder to make the next frame a keyframe (with SPS/PPS)."""
        encoder = self._encoder
        if encoder is None:
            return
        gst = self._gst
        event = gst.GstVideo.video_event_new_upstream_force_key_unit(gst.Gst.CLOCK_TIME_NONE, True, 0)
        encoder.get_static_pad("src").send_event(event)

    def close(self) -> None:
        """Stop publishing: the path disappears from the server and its clients are disconnected."""
        self._server.unpublish(self.path)

    # Called by the server (never with this publisher's lock held: GStreamer calls its
    # signal handlers with its own locks held, and those handlers take this lock).
    def _set_watchers(self, count: int) -> None:
        with self._cond:
            if self._watchers == 0 and count > 0:
                self._prime = True
            self._watchers = count
            if count == 0:
                self._pending = None
            self._cond.notify()

    def _client_started(self) -> None:
        now = time.monotonic()
        with self._cond:
            self._keyframes_due = sorted(self._keyframes_due + [now + delay for delay in _KEYFRAMES_AFTER_PLAY_S])
            media = self._media
            self._cond.notify()
        if media is not None:
            self._hold(media)

    def _hold(self, media: Any) -> None:
        """Keep `media` prepared when its clients leave (see the module docstring)."""
        with self._cond:
            if self._held is media or self._closed:
                return
            self._held = media
        if not media.prepare(None):
            with self._cond:
                if self._held is media:
                    self._held = None

    def _release(self) -> None:
        with self._cond:
            media, self._held = self._held, None
        if media is not None:
            media.unprepare()

    def _shutdown(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._pending = None
            self._cond.notify_all()
        self._release()
        self._detach()
        if self._feeder is not threading.current_thread():
            self._feeder.join(timeout=2.0)

    def _detach(self, media: Any = None) -> None:
        """Forget the current media (or only `media`, when given and still current)."""
        with self._cond:
            if media is not None and media is not self._media:
                return
            if self._held is self._media:
                self._held = None
            self._appsrc = self._encoder = self._media = None
            self._pending = None
            self._prime = False

    # GStreamer callbacks (client and media threads).
    def _on_media_configure(self, _factory: Any, media: Any) -> None:
        element = media.get_element()
        appsrc = element.get_by_name("src")
        encoder = element.get_by_name("enc")
        media.connect("prepared", self._hold)
        media.connect("unprepared", self._on_media_unprepared)
        if self.aud_after_frame:
            encoder.get_static_pad("src").add_probe(self._gst.Gst.PadProbeType.BUFFER, _AudAppender(self._gst))
        with self._cond:
            if self._closed:
                return
            self._appsrc, self._encoder, self._media = appsrc, encoder, media
            self._prime = True  # the media prepares (and the DESCRIBE returns) once a frame is encoded
            self._cond.notify()
        log.debug("RTSP %s: media configured", self.path)

    def _on_media_unprepared(self, media: Any) -> None:
        self._detach(media)
        log.debug("RTSP %s: media released", self.path)

    def _black(self) -> Image:
        return np.zeros((self.height, self.width, 3), np.uint8)

    # Feeder thread.
    def _next_frame(self, repeat_at: float | None) -> tuple[Image | None, bool, Any] | None:
        """Wait for what to send next, or None once closed: (image, fresh, appsrc).

        `image` is None to send the previous frame again (once `repeat_at` has passed); `fresh` is
        True for a frame from `push`, False for the last or a black one that starts a stream."""
        with self._cond:
            while not self._closed:
                appsrc = self._appsrc
                if appsrc is None:
                    self._cond.wait()
                elif self._pending is not None:
                    image, self._pending = self._pending, None
                    self._prime = False
                    return image, True, appsrc
                elif self._prime:
                    self._prime = False
                    return (self._last if self._last is not None else self._black()), False, appsrc
                elif self._watchers == 0 or repeat_at is None:
                    self._cond.wait()
                elif (wait := repeat_at - time.monotonic()) > 0:
                    self._cond.wait(wait)
                else:
                    return None, False, appsrc
            return None

    def _wait_playing(self, appsrc: Any) -> bool:
        """Wait (briefly) until the media's pipeline plays; False if it does not, or is replaced.

        A buffer pushed while the pipeline is still starting can reach the encoder without a
        timestamp, and the stream then stalls: the RTP sink waits for a running time 1000 hours
        ahead (x264enc's offset for negative DTS)."""
        playing = self._gst.Gst.State.PLAYING
        deadline = time.monotonic() + _START_TIMEOUT_S
        while appsrc.get_state(0)[1] != playing:
            with self._cond:
                if self._closed or self._appsrc is not appsrc or time.monotonic() > deadline:
                    return False
                self._cond.wait(0.005)
        return True

    def _keyframe_due(self) -> bool:
        now = time.monotonic()
        with self._cond:
            due = [t for t in self._keyframes_due if t <= now]
            if due:
                self._keyframes_due = self._keyframes_due[len(due) :]
            return bool(due)

    def _feed(self) -> None:
        interval = 1.0 / self.fps
        previous: bytes | None = None  # the last frame sent, as I420
        repeat_at: float | None = None
        while (item := self._next_frame(repeat_at)) is not None:
            image, fresh, appsrc = item
            try:
                if image is not None:
                    previous = self._to_i420(image).tobytes()
                    repeat_at = time.monotonic() + 2 * interval
                else:
                    repeat_at = time.monotonic() + interval
                if previous is None or not self._wait_playing(appsrc):
                    continue
                if self._keyframe_due():
                    self.request_keyframe()
                if appsrc.get_property("current-level-buffers") >= _APPSRC_MAX_BUFFERS:
                    with self._cond:
                        self.dropped += 1  # the appsrc drops its oldest to make room
                appsrc.emit("push-buffer", self._gst.Gst.Buffer.new_wrapped(previous))
                if fresh:
                    self.frames_sent += 1
                else:
                    self.frames_repeated += 1
            except Exception:
                self.errors += 1
                if self.errors == 1:
                    log.exception("RTSP %s: cannot hand frames to the encoder (counted from now on)", self.path)

    def _to_i420(self, image: Image) -> npt.NDArray[np.uint8]:
        h, w = image.shape[:2]
        sized: npt.NDArray[np.uint8] = image
        if (w, h) != (self.width, self.height):
            shrink = w * h > self.width * self.height
            sized = cv2.resize(  # type: ignore[assignment]
                image, (self.width, self.height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
            )
        return cv2.cvtColor(sized, cv2.COLOR_BGR2YUV_I420)  # type: ignore[return-value]


class _AudAppender:
    """A pad probe that sends each encoded frame on with an access unit delimiter appended.

    One per media: the recursion guard relies on the pad having a single streaming thread."""

    def __init__(self, gst: _Bindings) -> None:
        self._gst = gst
        self._inside = False

    def __call__(self, pad: Any, info: Any) -> Any:
        Gst = self._gst.Gst
        if self._inside:  # the buffer pushed below, coming through this probe again
            return Gst.PadProbeReturn.OK
        frame = info.get_buffer()
        ok, mapped = frame.map(Gst.MapFlags.READ)
        if not ok:
            return Gst.PadProbeReturn.OK
        try:
            data = bytes(mapped.data)
        finally:
            frame.unmap(mapped)
        out = Gst.Buffer.new_wrapped(data + _AUD)
        out.pts, out.dts, out.duration = frame.pts, frame.dts, frame.duration
        out.set_flags(frame.get_flags())
        self._inside = True
        try:
            pad.push(out)
        finally:
            self._inside = False
        return Gst.PadProbeReturn.HANDLED


def _new_auth(gst: _Bindings) -> Any:
    import gi

    gi.require_version("GstRtsp", "1.0")
    from gi.repository import GstRtsp

    auth = gst.GstRtspServer.RTSPAuth.new()
    auth.set_supported_methods(GstRtsp.RTSPAuthMethod.DIGEST)
    auth.set_realm("swapcast")
    return auth


def _add_login(gst: _Bindings, auth: Any, user: str, password: str) -> None:
    token = gst.GstRtspServer.RTSPToken()
    token.set_string("media.factory.role", user)
    auth.add_digest(user, password, token)


def _allow_role(gst: _Bindings, factory: Any, role: str | None) -> None:
    """Only `role` may see and play the factory's media; with no role, nobody may."""
    if role is None:
        return
    structure, _ = gst.Gst.Structure.from_string(
        f"{role}, media.factory.access=(boolean)true, media.factory.construct=(boolean)true"
    )
    factory.add_role_from_structure(structure)


class RtspServer:
    """An RTSP server on `host:port` with its own GLib main loop thread.

    `port=0` picks a free port (read `port` after `start`). Paths can be published before or
    after `start`; a stopped server can be started again and keeps its paths and its port.
    """

    def __init__(
        self, port: int = 8554, host: str = "127.0.0.1", *, client_threads: int = 16, authenticate: bool = False
    ) -> None:
        """`authenticate`: every path is refused (401) except to the login given when it was published, checked
        by gst-rtsp-server with Digest authentication (the password never crosses the network)."""
        self.host = host
        self.authenticate = authenticate
        self._auth: Any = None
        self._logins: dict[str, tuple[str, str]] = {}
        self._requested_port = port
        self._bound_port: int | None = None
        self._client_threads = client_threads
        self._lock = threading.Lock()
        self._publishers: dict[str, RtspPublisher] = {}
        self._clients: dict[Any, set[str]] = {}
        self._server: Any = None
        self._sources: list[Any] = []
        self._loop: Any = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RtspServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def available(self) -> bool:
        return _load_bindings()[0] is not None

    @property
    def unavailable_reason(self) -> str | None:
        return _load_bindings()[1]

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int:
        """The bound port while running, else the one asked for."""
        return self._bound_port if self._bound_port is not None else self._requested_port

    def start(self) -> None:
        """Listen and serve; `UserError` when GStreamer is missing or the port cannot be bound."""
        gst = _require_bindings()
        with self._lock:
            if self._server is not None:
                return
            context = gst.GLib.MainContext.new()
            server = gst.GstRtspServer.RTSPServer.new()
            server.set_address(self.host)
            server.set_service(str(self._requested_port))
            server.get_thread_pool().set_max_threads(self._client_threads)
            try:
                listener = server.create_source(None)
            except gst.GLib.Error as exc:
                raise UserError(f"cannot serve RTSP on {self.host}:{self._requested_port}: {exc.message}") from exc
            listener.attach(context)
            if self.authenticate:
                self._auth = _new_auth(gst)
                for login in self._logins.values():
                    _add_login(gst, self._auth, *login)
                server.set_auth(self._auth)
            server.connect("client-connected", self._on_client_connected)
            mounts = server.get_mount_points()
            for path, publisher in self._publishers.items():
                mounts.add_factory(path, publisher.factory)
            # Sessions of clients that vanished without a TEARDOWN (UDP transport) expire here.
            pool = server.get_session_pool()
            cleanup = gst.GLib.timeout_source_new_seconds(2)
            cleanup.set_callback(lambda *_: pool.cleanup() >= 0)
            cleanup.attach(context)
            loop = gst.GLib.MainLoop.new(context, False)
            thread = threading.Thread(target=self._run_loop, args=(loop, context), name="rtsp-server", daemon=True)
            self._server, self._loop, self._thread = server, loop, thread
            self._sources = [listener, cleanup]
            self._bound_port = int(server.get_bound_port())
            thread.start()
        log.info("RTSP server listening on rtsp://%s:%d", self.host, self._bound_port)

    @staticmethod
    def _run_loop(loop: Any, context: Any) -> None:
        context.push_thread_default()
        try:
            loop.run()
        finally:
            context.pop_thread_default()

    def stop(self) -> None:
        """Disconnect every client and stop listening. Published paths stay registered."""
        gst = _load_bindings()[0]
        with self._lock:
            server, loop, thread, sources = self._server, self._loop, self._thread, self._sources
            self._server = self._loop = self._thread = self._auth = None
            self._sources = []
            if self._requested_port == 0 and self._bound_port is not None:
                self._requested_port = self._bound_port  # a restart keeps the URLs handed out
            self._bound_port = None
            publishers = list(self._publishers.values())
        if server is None or gst is None:
            return
        for source in sources:
            source.destroy()
        server.client_filter(lambda *_: gst.GstRtspServer.RTSPFilterResult.REMOVE)
        mounts = server.get_mount_points()
        for publisher in publishers:
            mounts.remove_factory(publisher.path)
            publisher._release()
        loop.quit()
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5.0)
        with self._lock:
            self._clients.clear()
            for path in self._publishers:
                self._update_watchers(path)
        log.info("RTSP server stopped")

    def publish(
        self,
        path: str,
        width: int,
        height: int,
        fps: int,
        *,
        bitrate_kbps: int | None = None,
        aud_after_frame: bool = True,
        login: tuple[str, str] | None = None,
    ) -> RtspPublisher:
        """Serve `path` as H.264 at `width`x`height` (even numbers) and `fps`.

        `bitrate_kbps` defaults to `default_bitrate_kbps`; `aud_after_frame` is explained in the
        module docstring. `login` (user, password) is the one client allowed to play the path when the server
        authenticates; the user name must be unique to the path."""
        gst = _require_bindings()
        path = normalise_path(path)
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            raise UserError(f"RTSP frame size must be positive and even, got {width}x{height}")
        if not 1 <= fps <= 240:
            raise UserError(f"RTSP frame rate must be between 1 and 240, got {fps}")
        kbps = bitrate_kbps if bitrate_kbps is not None else default_bitrate_kbps(width, height, fps)
        with self._lock:
            if path in self._publishers:
                raise UserError(f"RTSP path {path} is already published")
            publisher = RtspPublisher(self, gst, path, width, height, fps, kbps, aud_after_frame)
            if self.authenticate:
                _allow_role(gst, publisher.factory, login[0] if login else None)
                if login is not None:
                    self._logins[path] = login
                    if self._auth is not None:
                        _add_login(gst, self._auth, *login)
            self._publishers[path] = publisher
            if self._server is not None:
                self._server.get_mount_points().add_factory(path, publisher.factory)
        log.info("RTSP publishing %s at %dx%d@%d, %d kbit/s", path, width, height, fps, kbps)
        return publisher

    def unpublish(self, path: str) -> None:
        """Remove `path` and disconnect the clients playing it; no-op if it is not published."""
        path = normalise_path(path)
        with self._lock:
            publisher = self._publishers.pop(path, None)
            server = self._server
            login = self._logins.pop(path, None)
            if login is not None and self._auth is not None:
                self._auth.remove_digest(login[0])
            if publisher is not None and server is not None:
                server.get_mount_points().remove_factory(path)
        if publisher is None:
            return
        if server is not None:
            self._disconnect_clients(server, path)
        publisher._shutdown()

    def publisher(self, path: str) -> RtspPublisher | None:
        return self._publishers.get(normalise_path(path))

    def paths(self) -> list[str]:
        with self._lock:
            return sorted(self._publishers)

    def url(self, path: str, host: str | None = None) -> str:
        """The URL clients use for `path`; `host` overrides the listening address (e.g. a public name)."""
        if host is None:
            host = "127.0.0.1" if self.host in ("", "0.0.0.0") else "::1" if self.host == "::" else self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"rtsp://{host}:{self.port}{normalise_path(path)}"

    def client_count(self, path: str | None = None) -> int:
        """Clients playing `path`, or all connected RTSP clients when `path` is None."""
        with self._lock:
            if path is None:
                return len(self._clients)
            p = normalise_path(path)
            return sum(1 for paths in self._clients.values() if p in paths)

    def _disconnect_clients(self, server: Any, path: str) -> None:
        gst = _require_bindings()
        result = gst.GstRtspServer.RTSPFilterResult

        def choose(_server: Any, client: Any, *_: Any) -> Any:
            with self._lock:
                playing = path in self._clients.get(client, ())
            return result.REMOVE if playing else result.KEEP

        server.client_filter(choose)

    def _match_path(self, uri_path: str) -> str | None:
        """The published path a request URI refers to (`/a/stream=0` belongs to `/a`)."""
        for path in self._publishers:
            if uri_path == path or uri_path.startswith(path + "/"):
                return path
        return None

    # GStreamer callbacks: client-connected runs on the loop thread, the rest on client threads.
    def _on_client_connected(self, _server: Any, client: Any) -> None:
        with self._lock:
            self._clients[client] = set()
        client.connect("play-request", self._on_play_request)
        client.connect("teardown-request", self._on_teardown_request)
        client.connect("closed", self._on_client_closed)

    def _on_play_request(self, client: Any, ctx: Any) -> None:
        uri = ctx.uri
        with self._lock:
            path = self._match_path(uri.abspath) if uri is not None else None
            if path is None or client not in self._clients:
                return
            self._clients[client].add(path)
            self._update_watchers(path)
            publisher = self._publishers.get(path)
        if publisher is not None:
            publisher._client_started()

    def _on_teardown_request(self, client: Any, ctx: Any) -> None:
        uri = ctx.uri
        with self._lock:
            path = self._match_path(uri.abspath) if uri is not None else None
            if path is not None and client in self._clients:
                self._clients[client].discard(path)
                self._update_watchers(path)

    def _on_client_closed(self, client: Any) -> None:
        with self._lock:
            for path in self._clients.pop(client, set()):
                self._update_watchers(path)

    def _update_watchers(self, path: str) -> None:
        """Tell `path`'s publisher how many clients play it (with `_lock` held, so in order)."""
        publisher = self._publishers.get(path)
        if publisher is not None:
            publisher._set_watchers(sum(1 for paths in self._clients.values() if path in paths))
