"""An RTSP server that OBS, ffmpeg or VLC can pull from: an embedded gst-rtsp-server with its own GLib loop.

It keeps the published paths and which client plays which, and tells each path's publisher how many
clients it has; the publishers do the rest.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from app.egress.rtsp.auth import (
    add_login,
    allow_only,
    guarded_mount_points,
    is_unauthorized,
    new_auth,
    remove_login,
)
from app.egress.rtsp.bindings import load_bindings, require_bindings
from app.egress.rtsp.publisher import RtspPublisher
from app.errors import UserError
from app.media.encoder import EncoderPolicy
from app.observability import Metrics
from app.settings import EncoderSettings

if TYPE_CHECKING:
    from app.egress.encode import SharedEncode

log = logging.getLogger(__name__)

CLOSE_WAIT_S = 2.0  # on stop, how long clients get to close themselves once their sockets are shut down

_PATH_RE = re.compile(r"^(/[A-Za-z0-9._~-]+)+$")


def normalise_path(path: str) -> str:
    """`"obs"` and `"/obs/"` both become `"/obs"`; `UserError` for anything that is not a plain URL path."""
    p = "/" + path.strip("/")
    if not _PATH_RE.fullmatch(p):  # `$` alone would let a final newline through
        raise UserError(f"invalid RTSP path {path!r}: use letters, digits and . _ ~ - separated by /")
    return p


class RtspServer:
    """An RTSP server on `host:port` with its own GLib main loop thread.

    `port=0` picks a free port (read `port` after `start`). Paths can be published before or
    after `start`; a stopped server can be started again and keeps its paths and its port.
    """

    def __init__(
        self,
        port: int = 8554,
        host: str = "127.0.0.1",
        *,
        client_threads: int = 16,
        authenticate: bool = False,
        on_auth_failure: Callable[[str], float] | None = None,
        encoder: EncoderPolicy | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """`encoder`: the H.264 settings of every path (the defaults when None); `metrics`: where the encodes of
        the paths published without one of their own count what they encode. `authenticate`: each path plays
        only for the login it was published with (`app.egress.rtsp.auth`); a path published without one plays
        for nobody. `on_auth_failure(address)` hears every failed login and says how long to hold the answer
        (that client's thread waits; guessing from one address slows down)."""
        self.host = host
        self.encoder = encoder or EncoderPolicy(EncoderSettings())
        self.metrics = metrics
        self.authenticate = authenticate
        self._on_auth_failure = on_auth_failure
        self._unauthorized: dict[Any, int] = {}
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
        return load_bindings()[0] is not None

    @property
    def unavailable_reason(self) -> str | None:
        return load_bindings()[1]

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def port(self) -> int:
        """The bound port while running, else the one asked for."""
        return self._bound_port if self._bound_port is not None else self._requested_port

    def start(self) -> None:
        """Listen and serve; `UserError` when GStreamer is missing or the port cannot be bound."""
        gst = require_bindings()
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
                self._auth = new_auth(gst)
                for login in self._logins.values():
                    add_login(gst, self._auth, *login)
                server.set_auth(self._auth)
                server.set_mount_points(guarded_mount_points(gst, self._is_published))
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
        gst = load_bindings()[0]
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
        self._close_clients(server, lambda _client: True, wait_s=CLOSE_WAIT_S)
        mounts = server.get_mount_points()
        for publisher in publishers:
            mounts.remove_factory(publisher.path)
            publisher.release()
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
        login: tuple[str, str] | None = None,
        audio: bool = False,
        encode: SharedEncode | None = None,
    ) -> RtspPublisher:
        """Serve `path` as H.264 at `width`x`height` (even numbers) and `fps`.

        `login` (user, password; the user unique to the path) is who may play it
        when the server authenticates; `audio` adds an Opus stream fed by the publisher's `push_audio`.
        With `encode`, the path serves that encode's packets (`app.egress.rtsp.packet_feed`) at its size and
        rate, which replace `width`, `height` and `fps`, and encodes nothing itself."""
        gst = require_bindings()
        path = normalise_path(path)
        if encode is not None:
            width, height, fps = encode.width, encode.height, encode.fps
        if width <= 0 or height <= 0 or width % 2 or height % 2:
            raise UserError(f"RTSP frame size must be positive and even, got {width}x{height}")
        if not 1 <= fps <= 240:
            raise UserError(f"RTSP frame rate must be between 1 and 240, got {fps}")
        kbps = self.encoder.shared_bitrate_kbps(width, height, fps)
        with self._lock:
            if path in self._publishers:
                raise UserError(f"RTSP path {path} is already published")
            publisher = RtspPublisher(
                self, gst, path, width, height, fps, audio, encoder=self.encoder, encode=encode, metrics=self.metrics
            )
            if self.authenticate and login is not None:
                allow_only(gst, publisher.factory, login[0])
                self._logins[path] = login
                if self._auth is not None:
                    add_login(gst, self._auth, *login)
            self._publishers[path] = publisher
            if self._server is not None:
                self._server.get_mount_points().add_factory(path, publisher.factory)
        log.info(
            "RTSP publishing %s at %dx%d@%d, %d kbit/s%s%s",
            path,
            width,
            height,
            fps,
            kbps,
            " with audio" * audio,
            " (another output's encode)" if encode is not None else "",
        )
        return publisher

    def change_login(self, path: str, login: tuple[str, str]) -> None:
        """Give a published path a new password (the user name stays: the path's factory grants its role) and
        disconnect the clients playing it with the old one."""
        gst = require_bindings()
        path = normalise_path(path)
        with self._lock:
            old = self._logins.get(path)
            if old is None or old[0] != login[0]:
                raise UserError(f"RTSP path {path} has no login for user {login[0]}")
            self._logins[path] = login
            server = self._server
            if self._auth is not None:
                remove_login(self._auth, old[0])
                add_login(gst, self._auth, *login)
        if server is not None:
            self._disconnect_clients(server, path)

    def unpublish(self, path: str) -> None:
        """Remove `path` and disconnect the clients playing it; no-op if it is not published."""
        path = normalise_path(path)
        with self._lock:
            publisher = self._publishers.pop(path, None)
            server = self._server
            login = self._logins.pop(path, None)
            if login is not None and self._auth is not None:
                remove_login(self._auth, login[0])
            if publisher is not None and server is not None:
                server.get_mount_points().remove_factory(path)
        if publisher is None:
            return
        if server is not None:
            self._disconnect_clients(server, path)
        publisher.shutdown()

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
        def playing(client: Any) -> bool:
            with self._lock:
                return path in self._clients.get(client, ())

        self._close_clients(server, playing, wait_s=0.0)  # callers may be on the event loop: no wait

    def _close_clients(self, server: Any, chosen: Callable[[Any], bool], wait_s: float) -> None:
        """Disconnect the `chosen` clients. Each client is served on a thread of its own, and closing one from
        here races with its watch there: a watch that fires after the close reads from a connection without a
        stream and, told nothing, fires again at once, forever (a core spent on GLib-CRITICAL lines). So each
        chosen client's socket is shut down, its own thread sees the end of the stream and closes it; with
        `wait_s`, those still connected after it are removed from here (the server is going away)."""
        gst = require_bindings()
        result = gst.GstRtspServer.RTSPFilterResult
        closing: list[Any] = []

        def shut_down(_server: Any, client: Any, *_: Any) -> Any:
            if chosen(client):
                connection = client.get_connection()
                socket = connection.get_read_socket() if connection is not None else None
                if socket is not None:
                    with contextlib.suppress(gst.GLib.Error):
                        socket.shutdown(True, True)
                closing.append(client)
            return result.KEEP

        server.client_filter(shut_down)
        if wait_s <= 0:
            return
        deadline = time.monotonic() + wait_s
        while closing and time.monotonic() < deadline:
            with self._lock:
                closing = [client for client in closing if client in self._clients]
            if closing:
                time.sleep(0.02)
        if closing:
            left = set(closing)
            server.client_filter(lambda _s, client, *_: result.REMOVE if client in left else result.KEEP)

    def _is_published(self, uri_path: str) -> bool:
        with self._lock:
            return self._match_path(uri_path) is not None

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
        if self.authenticate and self._on_auth_failure is not None:
            client.connect("send-message", self._on_send_message)

    def _on_send_message(self, client: Any, _ctx: Any, response: Any) -> None:
        """Hold a failed login's 401. The context's request is not readable from Python, so a failure is told
        from its place: the first 401 on a connection is the challenge every client gets, each later one
        answers a login that did not verify."""
        if not is_unauthorized(response):
            return
        with self._lock:
            count = self._unauthorized[client] = self._unauthorized.get(client, 0) + 1
        if count > 1 and self._on_auth_failure is not None:
            time.sleep(self._on_auth_failure(str(client.get_connection().get_ip())))

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
            publisher.client_started()

    def _on_teardown_request(self, client: Any, ctx: Any) -> None:
        uri = ctx.uri
        with self._lock:
            path = self._match_path(uri.abspath) if uri is not None else None
            if path is not None and client in self._clients:
                self._clients[client].discard(path)
                self._update_watchers(path)

    def _on_client_closed(self, client: Any) -> None:
        with self._lock:
            self._unauthorized.pop(client, None)
            for path in self._clients.pop(client, set()):
                self._update_watchers(path)

    def _update_watchers(self, path: str) -> None:
        """Tell `path`'s publisher how many clients play it (with `_lock` held, so in order)."""
        publisher = self._publishers.get(path)
        if publisher is not None:
            publisher.set_watchers(sum(1 for paths in self._clients.values() if path in paths))
