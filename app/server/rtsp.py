"""The RTSP output as the server sees it: optional, with the reason when it is off.

`app.egress.rtsp` needs GStreamer's RTSP server through PyGObject, which it loads on first use; when that
is missing or the server cannot start, the server still runs and `/readyz`, the start-up banner and the
stream routes say why RTSP is off.
"""

import base64
import functools
import hashlib
import hmac
import logging
import secrets
from collections.abc import Callable
from typing import Protocol

import av

from app.egress.encode import SharedEncode
from app.egress.rtsp import RtspServer
from app.live.frame import OutputFrame
from app.media.encoder import EncoderPolicy
from app.observability import Metrics
from app.pipeline.types import Image

log = logging.getLogger(__name__)


class FramePublisher(Protocol):
    @property
    def encode(self) -> SharedEncode:
        """The encode the path serves (its own, or the one it was published with), which the output's other
        readers share."""
        ...

    def push(self, image: Image | OutputFrame) -> None: ...

    def push_audio(self, frame: av.AudioFrame, due: float | None = None) -> None: ...

    def request_keyframe(self) -> None: ...

    def close(self) -> None: ...


class RtspOutput:
    def __init__(
        self,
        *,
        enabled: bool,
        port: int,
        host: str,
        public_host: str,
        authenticate: bool = True,
        on_auth_failure: Callable[[str], float] | None = None,
        encoder: EncoderPolicy | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        """`authenticate`: each published path gets its own login (in the URLs this object hands out, which
        only the path's owner sees); every other client is refused by the RTSP server, and each failed login
        waits `on_auth_failure(address)` seconds before its answer."""
        # The server `start` makes; made there, as it may not start (GStreamer missing, port taken).
        self._new_server = functools.partial(
            RtspServer,
            port,
            host=host,
            authenticate=authenticate,
            on_auth_failure=on_auth_failure,
            encoder=encoder,
            metrics=metrics,
        )
        self.port = port
        self.host = host
        self.public_host = public_host
        self.authenticate = authenticate
        # Logins are derived from the path with a secret of this process: nothing to store or forget, and a
        # restart invalidates every URL handed out before it.
        self._login_secret = secrets.token_bytes(32)
        self._server: RtspServer | None = None
        self.reason: str | None = None if enabled else "disabled by SWAPCAST_RTSP_ENABLED=false"
        self._enabled = enabled

    @property
    def available(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Start the RTSP server if it can run here; otherwise remember why not. Never raises."""
        if not self._enabled:
            return
        server = self._new_server()
        try:
            server.start()
        except Exception as exc:  # GStreamer is missing, or the server could not bind or build its pipeline
            self.reason = f"RTSP server did not start: {exc}"
            log.warning("%s", self.reason)
            return
        self._server = server
        self.reason = None

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            _stop_quietly(server)

    def publish(
        self,
        path: str,
        width: int,
        height: int,
        fps: int = 30,
        *,
        audio: bool = False,
        login: tuple[str, str] | None = None,
        encode: SharedEncode | None = None,
    ) -> FramePublisher:
        """Serve `path` at (even-rounded) `width`x`height`; frames of another size are resized on push. With
        `audio`, the path has an Opus stream too, fed by the publisher's `push_audio`. `login` replaces the
        path's derived one (a channel's, which outlives this process). With `encode`, the path serves that
        encode's packets at its size and rate: `push` does nothing, `request_keyframe` asks the encode."""
        if self._server is None:
            raise RuntimeError(self.reason or "RTSP output is off")
        even_width, even_height = max(2, width - width % 2), max(2, height - height % 2)
        login = (login or self.login(path)) if self.authenticate else None
        publisher: FramePublisher = self._server.publish(
            path, even_width, even_height, fps, login=login, audio=audio, encode=encode
        )
        return publisher

    def change_login(self, path: str, login: tuple[str, str]) -> None:
        """A published path's new login; clients that play it are disconnected (they logged in with the old)."""
        if self._server is not None and self.authenticate:
            self._server.change_login(path, login)

    def login(self, path: str) -> tuple[str, str]:
        """The user name and password that may play `path` (unique to the path, 144 bits of password)."""
        digest = hmac.new(self._login_secret, ("/" + path.lstrip("/")).encode(), hashlib.sha256).digest()
        return f"u{digest[:6].hex()}", base64.urlsafe_b64encode(digest[6:24]).decode()

    def url(self, path: str, login: tuple[str, str] | None = None) -> str:
        """The URL a client plays `path` at, with the path's login (derived, or `login`) when the server
        authenticates."""
        base = self.base_url()
        if self.authenticate:
            user, password = login or self.login(path)
            base = base.replace("rtsp://", f"rtsp://{user}:{password}@", 1)
        return f"{base}{path.lstrip('/')}"

    def base_url(self) -> str:
        """rtsp://host:port/ with the public host and the port actually bound."""
        server = self._server
        port = int(server.port) if server is not None else self.port
        host = self.public_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"rtsp://{host}:{port}/"

    def client_count(self, paths: list[str]) -> int:
        server = self._server
        if server is None:
            return 0
        total = 0
        for path in paths:
            try:
                total += int(server.client_count(path))
            except Exception:  # a path that closed meanwhile counts no clients
                continue
        return total


def _stop_quietly(server: RtspServer) -> None:
    try:
        server.stop()
    except Exception:
        log.exception("RTSP server did not stop cleanly")
