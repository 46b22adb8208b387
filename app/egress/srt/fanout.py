"""One channel's SRT callers: every MPEG-TS chunk of the channel's one encode goes to each of them.

Sends are non-blocking (the listener sets `SRTO_SNDSYN` off): a caller whose send buffer is full loses that
chunk, counted, and one that has taken nothing for `SLOW_S` is disconnected, so a slow caller never holds up
the encode or the other callers. A caller whose connection broke is dropped at its next send.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from app.egress.srt import lib

log = logging.getLogger(__name__)

SLOW_S = 5.0


@dataclass
class Caller:
    sock: int
    address: str
    since: float = field(default_factory=time.monotonic)
    last_sent: float = field(default_factory=time.monotonic)
    chunks_dropped: int = 0


class Fanout:
    def __init__(self, channel: str, srt: Any) -> None:
        self.channel = channel
        self._srt = srt
        self._lock = threading.Lock()
        self._callers: dict[int, Caller] = {}
        self._sent = 0  # bytes, since `sent` was last called
        self.bytes_sent = 0
        self.chunks_dropped = 0

    def add(self, sock: int, address: str) -> None:
        with self._lock:
            self._callers[sock] = Caller(sock, address)

    def count(self) -> int:
        with self._lock:
            return len(self._callers)

    def close_all(self) -> None:
        """Every caller is disconnected (the channel went, or its passphrase changed)."""
        with self._lock:
            callers, self._callers = list(self._callers.values()), {}
        for caller in callers:
            self._srt.srt_close(caller.sock)

    def sent(self) -> int:
        with self._lock:
            sent, self._sent = self._sent, 0
            return sent

    def write(self, data: bytes) -> int:
        """Send one chunk (at most libsrt's live payload, 1316 bytes) to every caller; what the muxer writes."""
        with self._lock:
            callers = list(self._callers.values())
        now = time.monotonic()
        gone: list[tuple[Caller, str]] = []
        for caller in callers:
            if self._srt.srt_sendmsg2(caller.sock, data, len(data), None) != lib.SRT_ERROR:
                caller.last_sent = now
                with self._lock:
                    self._sent += len(data)
                    self.bytes_sent += len(data)
                continue
            if lib.last_errno(self._srt) != lib.SRT_EASYNCSND:
                gone.append((caller, lib.last_error(self._srt)))
                continue
            caller.chunks_dropped += 1
            with self._lock:
                self.chunks_dropped += 1
            if now - caller.last_sent > SLOW_S:
                gone.append((caller, f"took nothing for {SLOW_S:.0f} s"))
        for caller, why in gone:
            with self._lock:
                self._callers.pop(caller.sock, None)
            self._srt.srt_close(caller.sock)
            log.info("SRT caller %s of channel %s left: %s", caller.address, self.channel, why)
        return len(data)
