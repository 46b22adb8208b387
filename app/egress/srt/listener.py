"""The SRT output's one listener: callers pick a channel by stream id and must give its passphrase.

Why libsrt itself and not GStreamer's `srtsink`: srtsink has one passphrase for all its callers, and a channel
each needs its own on the one port. libsrt's accept hook runs before the key exchange and sets the passphrase
of each new connection from the stream id it asked for; a caller whose passphrase differs then fails the key
exchange and is never accepted. An unknown stream id gets a random passphrase, so a caller learns nothing about
which channels exist; the refusal's real reason goes to `on_refused`, without the passphrase.

libsrt tells the listener nothing of a handshake that failed after its hook, so a connection the hook let
through that is not accepted within `PENDING_S` counts as refused.

Refusals are logged (WARNING) and handed to `on_refused` (the audit log) for the first `REFUSALS_SHOWN` of each
client address in any `REFUSAL_WINDOW_S`; the rest are counted (`refusals_unreported`), and each address's
count goes out as one line when its window ends: a caller that retries 300 times in 3 s makes a dozen lines,
not 600.

A channel's callers share its one encode (`ChannelEncode`), started with the first and stopped `IDLE_S` after
the last leaves.
"""

from __future__ import annotations

import ctypes
import logging
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from app.egress.srt import lib
from app.egress.srt.encode import ChannelEncode, Feed
from app.egress.srt.fanout import Fanout

log = logging.getLogger(__name__)

PENDING_S = 3.0
IDLE_S = 2.0
WAIT_MS = 200
STREAM_ID_SHOWN = 64  # characters of a refused stream id kept in the log
LATENCY_MS = 120
REFUSALS_SHOWN = 10  # refusals of one client address logged and audited in full per window
REFUSAL_WINDOW_S = 60.0
REFUSAL_ADDRESSES = 4096  # addresses tracked at once; beyond them refusals are only counted

Refused = Callable[[str, str, str], None]  # (client address, stream id as shown, reason)


def channel_of(stream_id: str) -> str | None:
    """The channel a stream id reads: the name itself, or SRT's access-control form `#!::r=NAME[,m=request]`;
    None for a publish request or an id without a name."""
    if not stream_id.startswith("#!::"):
        return stream_id or None
    fields = dict(item.split("=", 1) for item in stream_id[4:].split(",") if "=" in item)
    if fields.get("m", "request") != "request":
        return None
    return fields.get("r") or None


def shown(stream_id: str) -> str:
    printable = "".join(c if c.isprintable() else "?" for c in stream_id[:STREAM_ID_SHOWN])
    return printable + ("…" if len(stream_id) > STREAM_ID_SHOWN else "")


@dataclass
class _Channel:
    name: str
    passphrase: str
    feed: Feed
    fanout: Fanout
    encode: ChannelEncode | None = None
    idle_since: float | None = None


@dataclass
class _Refusals:
    """One client address's refusals in its current window."""

    since: float
    shown: int = 0
    unreported: int = 0


@dataclass(frozen=True)
class _Pending:
    channel: str | None  # None: the stream id names no channel here
    passphrase: str
    stream_id: str
    address: str
    at: float


class SrtListener:
    def __init__(self, port: int, host: str, *, on_refused: Refused | None = None) -> None:
        self._requested = (host, port)
        self._on_refused = on_refused
        self._lock = threading.Lock()
        self._channels: dict[str, _Channel] = {}
        self._pending: dict[int, _Pending] = {}
        self._refusals: dict[str, _Refusals] = {}  # by client address, guarded by `_refusals_lock`
        self._refusals_lock = threading.Lock()
        self.refusals_unreported = 0  # refusals counted but not logged one by one, since the start
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._hook = lib.ListenHook(self._on_connect)  # kept: libsrt calls it for as long as it listens
        self._srt = lib.load()
        self._sock = lib.SRT_INVALID_SOCK
        self._epoll = -1
        self.port = port

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Bind and listen; `lib.SrtError` when the port cannot be had."""
        srt = self._srt
        host, port = self._requested
        sock = lib.check(srt, srt.srt_create_socket(), "create")
        try:
            lib.set_int(srt, sock, lib.SRTO_RCVSYN, 0)  # accept from the epoll loop, never blocking
            lib.set_int(srt, sock, lib.SRTO_SNDSYN, 0)  # inherited: a caller's full buffer never blocks a send
            lib.set_int(srt, sock, lib.SRTO_LATENCY, LATENCY_MS)
            lib.set_int(srt, sock, lib.SRTO_ENFORCEDENCRYPTION, 1)  # no passphrase, no connection
            address = lib.sockaddr(host, port)
            lib.check(srt, srt.srt_bind(sock, address, len(address)), f"bind {host}:{port}")
            lib.check(srt, srt.srt_listen_callback(sock, self._hook, None), "listen callback")
            lib.check(srt, srt.srt_listen(sock, 16), "listen")
            self.port = lib.bound_port(srt, sock)
            epoll = lib.check(srt, srt.srt_epoll_create(), "epoll")
            events = ctypes.c_int(lib.SRT_EPOLL_IN | lib.SRT_EPOLL_ERR)
            lib.check(srt, srt.srt_epoll_add_usock(epoll, sock, ctypes.byref(events)), "epoll add")
        except Exception:
            srt.srt_close(sock)
            raise
        self._sock, self._epoll = sock, epoll
        self._thread = threading.Thread(target=self._run, name="srt-listener", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Blocking: the port closes, every caller is disconnected and every encode stops."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(5)
        self._srt.srt_close(self._sock)
        if self._epoll >= 0:
            self._srt.srt_epoll_release(self._epoll)
        for name in list(self._channels):
            self.unpublish(name)

    # ------------------------------------------------------------------------------ channels

    def publish(self, name: str, passphrase: str, feed: Feed) -> None:
        """Callers may read `name` with `passphrase`."""
        with self._lock:
            self._channels[name] = _Channel(name, passphrase, feed, Fanout(name, self._srt))

    def change_passphrase(self, name: str, passphrase: str) -> None:
        """A new passphrase: callers that connected with the old one are disconnected."""
        with self._lock:
            channel = self._channels.get(name)
            if channel is None:
                return
            channel.passphrase = passphrase
        channel.fanout.close_all()

    def unpublish(self, name: str) -> None:
        """Blocking: the channel's callers are disconnected and its encode stops."""
        with self._lock:
            channel = self._channels.pop(name, None)
            encode = channel.encode if channel is not None else None
        if channel is None:
            return
        channel.fanout.close_all()
        if encode is not None:
            encode.stop()

    def caller_count(self, name: str) -> int:
        with self._lock:
            channel = self._channels.get(name)
        return channel.fanout.count() if channel is not None else 0

    # ------------------------------------------------------------------------------ libsrt's threads

    def _on_connect(self, _opaque: int | None, sock: int, version: int, peer: int | None, raw: bytes | None) -> int:
        """libsrt's accept hook (its receiving thread): the passphrase this connection must prove. Returns 0 to
        go on with the handshake, -1 to refuse it; anything unexpected refuses."""
        try:
            address = lib.peer_address(peer)
            stream_id = raw.decode(errors="replace") if raw else ""
            if version < 5:
                self._refused(address, stream_id, "the caller is too old to send a stream id (SRT before 1.3)")
                return -1
            name = channel_of(stream_id)
            with self._lock:
                channel = self._channels.get(name) if name is not None else None
                passphrase = channel.passphrase if channel is not None else secrets.token_urlsafe(24)
                self._pending[sock] = _Pending(
                    channel.name if channel else None, passphrase, stream_id, address, time.monotonic()
                )
            lib.set_passphrase(self._srt, sock, passphrase)
            return 0
        except Exception:  # refused, never let through by accident
            log.exception("SRT: the accept hook failed")
            return -1

    def _run(self) -> None:
        events = (lib.EpollEvent * 4)()
        while not self._stopping.is_set():
            ready = self._srt.srt_epoll_uwait(self._epoll, events, len(events), WAIT_MS)
            if ready > 0:
                self._accept_all()
            elif ready < 0 and not self._stopping.is_set():
                time.sleep(WAIT_MS / 1000)  # epoll with nothing ready may answer an error: wait all the same
            try:
                self._sweep()
            except Exception:  # the loop outlives any one bad turn
                log.exception("SRT: the listener's sweep failed")

    def _accept_all(self) -> None:
        while True:
            sock = self._srt.srt_accept(self._sock, None, None)
            if sock == lib.SRT_INVALID_SOCK:
                return
            with self._lock:
                pending = self._pending.pop(sock, None)
                channel = self._channels.get(pending.channel) if pending and pending.channel else None
                current = channel is not None and pending is not None and channel.passphrase == pending.passphrase
            if pending is None or channel is None or not current:
                self._srt.srt_close(sock)  # the channel went, or its passphrase changed, during the handshake
                if pending is not None:
                    self._refused(pending.address, pending.stream_id, "the channel's credentials changed")
                continue
            self._add_caller(channel, sock, pending.address)

    def _add_caller(self, channel: _Channel, sock: int, address: str) -> None:
        with self._lock:  # against `unpublish`: an encode is never started for a channel that went
            if self._channels.get(channel.name) is not channel:
                self._srt.srt_close(sock)
                return
            channel.fanout.add(sock, address)
            channel.idle_since = None
            if channel.encode is None:
                channel.encode = ChannelEncode(channel.name, channel.feed, channel.fanout)
                channel.encode.start()
            channel.encode.keyframe()  # the new caller's picture starts at once
        log.info("SRT caller %s reads channel %s", address, channel.name)

    def _sweep(self) -> None:
        """Handshakes that never completed are refusals; encodes without callers stop."""
        now = time.monotonic()
        with self._lock:
            failed = [s for s, p in self._pending.items() if now - p.at > PENDING_S]
            refusals = [self._pending.pop(s) for s in failed]
            channels = list(self._channels.values())
        for pending in refusals:
            reason = "no channel has that stream id" if pending.channel is None else "wrong or missing passphrase"
            self._refused(pending.address, pending.stream_id, reason)
        self._end_refusal_windows(now)
        for channel in channels:
            with self._lock:
                encode = channel.encode
                if encode is None or channel.fanout.count() > 0:
                    channel.idle_since = None
                    continue
                if channel.idle_since is None or now - channel.idle_since < IDLE_S:
                    channel.idle_since = channel.idle_since or now
                    continue
                channel.encode, channel.idle_since = None, None
            # Stopping waits for the encoder's thread: not here, where callers are accepted.
            threading.Thread(target=encode.stop, name=f"srt-{channel.name}-stop", daemon=True).start()

    def _refused(self, address: str, stream_id: str, reason: str) -> None:
        """Logged and audited while the address is within its share of the window; counted otherwise."""
        now = time.monotonic()
        with self._refusals_lock:
            window = self._refusals.get(address)
            if window is None and len(self._refusals) < REFUSAL_ADDRESSES:
                window = self._refusals[address] = _Refusals(now)
            report = window is not None and window.shown < REFUSALS_SHOWN
            if window is not None:
                window.shown += report
                window.unreported += not report
            if not report:
                self.refusals_unreported += 1
        if report:
            log.warning("SRT caller %s refused (stream id %r): %s", address, shown(stream_id), reason)
            if self._on_refused is not None:
                self._on_refused(address, shown(stream_id), reason)

    def _end_refusal_windows(self, now: float) -> None:
        """Each address whose window ended: forgotten, and what it was not told of said in one line."""
        with self._refusals_lock:
            ended = [(a, w) for a, w in self._refusals.items() if now - w.since >= REFUSAL_WINDOW_S]
            for address, _ in ended:
                del self._refusals[address]
        for address, window in ended:
            if window.unreported:
                reason = f"{window.unreported} more refusals in {REFUSAL_WINDOW_S:.0f} s, not logged one by one"
                log.warning("SRT caller %s: %s", address, reason)
                if self._on_refused is not None:
                    self._on_refused(address, "", reason)
