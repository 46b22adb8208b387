"""The SRT output as the server sees it: off unless `SWAPCAST_SRT_PORT` is set, and then on where libsrt loads
and the port can be had; otherwise off with the reason, and the server runs on.

Channels are read on it by stream id (the channel's name) and passphrase (the channel's RTSP password: one
credential per channel, moved on together by rotation); `app.egress.srt` does the rest.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable

from app.egress.srt import SrtListener, unavailable_reason
from app.egress.srt.encode import Feed

log = logging.getLogger(__name__)

Refused = Callable[[str, str, str], None]


class SrtOutput:
    def __init__(
        self,
        *,
        port: int | None,
        host: str,
        public_host: str,
        on_refused: Refused | None = None,
    ) -> None:
        """`on_refused(address, stream id, reason)` hears each refused caller (never its passphrase)."""
        self._port, self._host, self.public_host = port, host, public_host
        self._on_refused = on_refused
        self._listener: SrtListener | None = None
        self.reason: str | None = "off (SWAPCAST_SRT_PORT is not set)" if port is None else None

    @property
    def available(self) -> bool:
        return self._listener is not None

    def start(self) -> None:
        """Listen if SRT can run here; otherwise remember why not. Never raises (blocking: off the event loop)."""
        if self._port is None:
            return
        missing = unavailable_reason()
        if missing is not None:
            self.reason = missing
            log.warning("SRT output is off: %s", missing)
            return
        listener = SrtListener(self._port, self._host, on_refused=self._on_refused)
        try:
            listener.start()
        except Exception as exc:  # the port is taken, or the address is not this machine's
            self.reason = f"SRT output did not start: {exc}"
            log.warning("%s", self.reason)
            return
        self._listener = listener
        self.reason = None
        log.info("SRT output listening on %s:%d", self._host, listener.port)

    def stop(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.stop()

    def publish(self, name: str, passphrase: str, feed: Feed) -> str:
        """Callers may read `name` with `passphrase`; returns the URL they read it at."""
        if self._listener is None:
            raise RuntimeError(self.reason or "SRT output is off")
        self._listener.publish(name, passphrase, feed)
        return self.url(name, passphrase)

    def change_passphrase(self, name: str, passphrase: str) -> str:
        """The channel's new passphrase (its callers are disconnected); returns its new URL."""
        if self._listener is not None:
            self._listener.change_passphrase(name, passphrase)
        return self.url(name, passphrase)

    def unpublish(self, name: str) -> None:
        """Blocking: the channel's callers are disconnected and its encode stops."""
        if self._listener is not None:
            self._listener.unpublish(name)

    def caller_count(self, name: str) -> int:
        return self._listener.caller_count(name) if self._listener is not None else 0

    def url(self, name: str, passphrase: str) -> str:
        """srt://host:port?streamid=NAME&passphrase=..., what OBS's Media Source takes as its input."""
        query = urllib.parse.urlencode({"streamid": name, "passphrase": passphrase})
        return f"{self.base_url()}?{query}"

    def base_url(self) -> str:
        """srt://host:port with the public host and the port actually bound."""
        port = self._listener.port if self._listener is not None else self._port
        host = self.public_host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"srt://{host}:{port}"
