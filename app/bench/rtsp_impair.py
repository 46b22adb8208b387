"""An RTSP proxy that impairs what passes through it, for `swapcast bench-network`'s RTSP-ingest paths.

A client is given the proxy's URL for an RTSP source; each control connection is forwarded to the source, with
the source's address in URLs (request lines, Content-Base, RTP-Info, the SDP) swapped for the proxy's and back.
A SETUP for RTP over UDP has its Transport header rewritten both ways: the source is told the client listens on
the server-facing ports of two `UdpRelay`s (RTP and RTCP, each a consecutive pair as RTP expects), the client
that the source sends from their client-facing ports, so every datagram passes a relay and gets the relay's
impairment per direction (loss, burst loss, delay and jitter, the cap, outages).

RTP interleaved on the control connection (RTSP over TCP) travels as a byte stream, which loses nothing: a lost
segment is sent again, and shows as delay. So on TCP the proxy applies delay (jitter without reordering), the
cap (with no queue limit: the sender is held back, as TCP's flow control holds it) and outages (bytes wait for
the link to come back), but not loss. The control connection of a UDP setup gets the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import re
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from app.bench.impair import CLEAR, DOWNSTREAM, UPSTREAM, DirectionCounters, Impairment, UdpRelay

INTERLEAVED = b"$"
MAX_QUEUED = 256  # chunks a TCP direction holds before it stops reading (and so holds back the sender)
PAIR_TRIES = 50
_CLIENT_PORT = re.compile(rb"client_port=(\d+)-(\d+)", re.I)
_SERVER_PORT = re.compile(rb"server_port=(\d+)-(\d+)", re.I)
_SOURCE = re.compile(rb"source=[^;\r\n]*", re.I)
_TRANSPORT = re.compile(rb"^Transport:[^\r\n]*", re.I | re.M)
_CSEQ = re.compile(rb"^CSeq:\s*(\d+)", re.I | re.M)
_LENGTH = re.compile(rb"^Content-Length:\s*(\d+)\r\n", re.I | re.M)


class StreamShaper:
    """One direction of a TCP connection through the impaired link: chunks leave in order, each after the
    delay (and jitter), the cap's serialisation and any outage it met; nothing is dropped."""

    def __init__(self, writer: asyncio.StreamWriter, seed: str, clock: Callable[[], float] = time.monotonic) -> None:
        self._writer = writer
        self._rng = random.Random(seed)
        self._clock = clock
        self._queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue(MAX_QUEUED)
        self.counters = DirectionCounters()  # `dropped` stays empty; held says what delayed a chunk
        self.held: Counter[str] = Counter()
        self.impairment = CLEAR
        self._since = clock()
        self._link_free_at = 0.0
        self._last_at = 0.0

    def apply(self, impairment: Impairment, since: float) -> None:
        self.impairment, self._since, self._link_free_at = impairment, since, 0.0

    async def put(self, data: bytes) -> None:
        now = self._clock()
        impairment = self.impairment
        self.counters.datagrams_in += 1
        self.counters.bytes_in += len(data)
        leaves = now
        end = impairment.outage_end(now - self._since)
        if end is not None:
            leaves = self._since + end
            self.held["outage"] += 1
        if impairment.rate_bps is not None:
            leaves = max(leaves, self._link_free_at) + len(data) * 8 / impairment.rate_bps
            self._link_free_at = leaves
        if impairment.delay_ms or impairment.jitter_ms:
            spread = self._rng.uniform(-impairment.jitter_ms, impairment.jitter_ms)
            leaves += max(0.0, impairment.delay_ms + spread) / 1000.0
        leaves = max(leaves, self._last_at)  # a byte stream keeps its order, whatever the jitter
        self._last_at = leaves
        await self._queue.put((leaves, data))

    async def run(self) -> None:
        while True:
            leaves, data = await self._queue.get()
            wait = leaves - self._clock()
            if wait > 0:
                await asyncio.sleep(wait)
            self._writer.write(data)
            await self._writer.drain()
            self.counters.delivered += 1
            self.counters.bytes_delivered += len(data)


@dataclass
class _Setup:
    """A UDP SETUP under way: the relays standing for its RTP and RTCP ports, and the client's real ports."""

    rtp: UdpRelay
    rtcp: UdpRelay
    client_ports: tuple[int, int]


class RtspImpairProxy:
    """Listens on `host` (a free port) for RTSP clients of `source_url`'s server and impairs their media as
    `impair` says, from the moment it is called (connections and relays made later follow the same clock)."""

    def __init__(self, source_url: str, *, seed: int = 0, host: str = "127.0.0.1") -> None:
        parts = urlsplit(source_url)
        if parts.scheme != "rtsp" or not parts.hostname:
            raise ValueError(f"not an rtsp:// URL: {source_url!r}")
        self.source_url = source_url
        self.host = host
        self.seed = seed
        self._upstream = (parts.hostname, parts.port or 554)
        self._server: asyncio.Server | None = None
        self._impairment = CLEAR
        self._since = time.monotonic()
        self._relays: list[tuple[str, UdpRelay]] = []  # ("rtp" or "rtcp", relay)
        self._shapers: list[tuple[str, StreamShaper]] = []  # (direction, shaper)
        self._connections: set[asyncio.Task[None]] = set()
        self.setups: Counter[str] = Counter()  # by the transport the source agreed to
        self.interleaved: Counter[str] = Counter()  # `$` frames by direction

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, 0)

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the proxy first"
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        """The source's URL with the proxy's address."""
        parts = urlsplit(self.source_url)
        userinfo = parts.netloc.rpartition("@")[0]
        netloc = (userinfo + "@" if userinfo else "") + f"{self.host}:{self.port}"
        return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))

    def impair(self, impairment: Impairment) -> None:
        """Impair every flow, now and to come, as `impairment` says; its outages count from now."""
        self._impairment, self._since = impairment, time.monotonic()
        for _, relay in self._relays:
            relay.impair(impairment)
        for _, shaper in self._shapers:
            shaper.apply(impairment, self._since)

    def _current(self) -> Impairment:
        """The impairment for a flow starting now: outages moved to its own clock, which starts now."""
        elapsed = time.monotonic() - self._since
        outages = tuple((start - elapsed, length) for start, length in self._impairment.outages)
        return replace(self._impairment, outages=outages)

    def counters(self) -> dict[str, Any]:
        """Datagrams and bytes per UDP flow and direction (summed over setups), bytes per TCP direction, the
        setups by transport and the interleaved frames by direction."""
        udp: dict[str, dict[str, DirectionCounters]] = {}
        for kind, relay in self._relays:
            for name, direction in ((UPSTREAM, relay.upstream), (DOWNSTREAM, relay.downstream)):
                total = udp.setdefault(kind, {}).setdefault(name, DirectionCounters())
                _add(total, direction.counters)
        tcp: dict[str, DirectionCounters] = {}
        held: dict[str, Counter[str]] = {}
        for name, shaper in self._shapers:
            _add(tcp.setdefault(name, DirectionCounters()), shaper.counters)
            held.setdefault(name, Counter()).update(shaper.held)
        return {
            "udp": {kind: {n: c.as_dict() for n, c in flows.items()} for kind, flows in udp.items()},
            "tcp": {n: c.as_dict() | {"held": dict(held[n])} for n, c in tcp.items()},
            "setups": dict(self.setups),
            "interleaved_frames": dict(self.interleaved),
        }

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)

    # ------------------------------------------------------------------------------------------------ connections

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        try:
            await self._serve(client_reader, client_writer)
        except (asyncio.CancelledError, ConnectionError, asyncio.IncompleteReadError, OSError):
            pass
        finally:
            self._connections.discard(task)
            client_writer.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(*self._upstream)
        peer_host = str(client_writer.get_extra_info("peername")[0])
        own = f"rtsp://{self.host}:{self.port}".encode()
        theirs = f"rtsp://{self._upstream[0]}:{self._upstream[1]}".encode()
        count = len(self._shapers)
        to_server = StreamShaper(server_writer, f"{self.seed}/tcp{count}/{UPSTREAM}")
        to_client = StreamShaper(client_writer, f"{self.seed}/tcp{count}/{DOWNSTREAM}")
        for name, shaper in ((UPSTREAM, to_server), (DOWNSTREAM, to_client)):
            shaper.apply(self._current(), time.monotonic())
            self._shapers.append((name, shaper))
        pending: dict[bytes, _Setup] = {}  # by CSeq
        relays: list[UdpRelay] = []

        async def request(message: bytes) -> bytes:
            message = _swap(message, own, theirs)
            transport = _TRANSPORT.search(message)
            ports = _CLIENT_PORT.search(transport.group(0)) if transport else None
            cseq = _CSEQ.search(message)
            if transport is None or ports is None or cseq is None:
                return message
            rtp, rtcp = await self._relay_pair()
            relays.extend((rtp, rtcp))
            pending[cseq.group(1)] = _Setup(rtp, rtcp, (int(ports.group(1)), int(ports.group(2))))
            for relay, port in ((rtp, ports.group(1)), (rtcp, ports.group(2))):
                relay.connect(client=(peer_host, int(port)))
            routed = f"client_port={rtp.server_facing[1]}-{rtcp.server_facing[1]}".encode()
            line = _CLIENT_PORT.sub(routed, transport.group(0))
            return message[: transport.start()] + line + message[transport.end() :]

        async def reply(message: bytes) -> bytes:
            message = _swap(message, theirs, own)
            transport = _TRANSPORT.search(message)
            cseq = _CSEQ.search(message)
            if transport is None or cseq is None:
                return message
            setup = pending.pop(cseq.group(1), None)
            ports = _SERVER_PORT.search(transport.group(0))
            if b"interleaved=" in transport.group(0).lower():
                self.setups["tcp"] += 1
            if setup is None or ports is None:
                return message
            self.setups["udp"] += 1
            setup.rtp.connect(server=(self._upstream[0], int(ports.group(1))))
            setup.rtcp.connect(server=(self._upstream[0], int(ports.group(2))))
            for relay in (setup.rtp, setup.rtcp):
                relay.impair(self._current())
            line = _SERVER_PORT.sub(
                f"server_port={setup.rtp.client_facing[1]}-{setup.rtcp.client_facing[1]}".encode(), transport.group(0)
            )
            line = _SOURCE.sub(f"source={self.host}".encode(), line)
            return message[: transport.start()] + line + message[transport.end() :]

        tasks = [
            asyncio.ensure_future(self._pump(client_reader, request, to_server, UPSTREAM)),
            asyncio.ensure_future(self._pump(server_reader, reply, to_client, DOWNSTREAM)),
            asyncio.ensure_future(to_server.run()),
            asyncio.ensure_future(to_client.run()),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            server_writer.close()
            for relay in relays:
                relay.close()

    async def _pump(
        self,
        reader: asyncio.StreamReader,
        rewrite: Callable[[bytes], Awaitable[bytes]],
        shaper: StreamShaper,
        direction: str,
    ) -> None:
        """Read RTSP messages and interleaved frames from `reader` until it ends; each goes, rewritten where it
        is a message, to `shaper`."""
        while True:
            first = await reader.read(1)
            if not first:
                return
            if first == INTERLEAVED:
                header = await reader.readexactly(3)
                data = await reader.readexactly(int.from_bytes(header[1:3], "big"))
                self.interleaved[direction] += 1
                await shaper.put(first + header + data)
                continue
            head = first + await reader.readuntil(b"\r\n\r\n")
            length = _LENGTH.search(head)
            body = await reader.readexactly(int(length.group(1))) if length else b""
            await shaper.put(await rewrite(head + body))

    async def _relay_pair(self) -> tuple[UdpRelay, UdpRelay]:
        """Relays for RTP and RTCP whose ports on each side are consecutive, RTP's even (RTP's convention, which
        some clients assume whatever the Transport header says)."""
        rng = random.Random()
        index = len(self._relays)
        for _ in range(PAIR_TRIES):
            client_port, server_port = (rng.randrange(20000, 60000, 2) for _ in range(2))
            rtp = UdpRelay(seed=f"{self.seed}/rtp{index}", host=self.host)
            rtcp = UdpRelay(seed=f"{self.seed}/rtcp{index}", host=self.host)
            try:
                await rtp.start(client_port, server_port)
            except OSError:
                continue
            try:
                await rtcp.start(client_port + 1, server_port + 1)
            except OSError:
                rtp.close()
                continue
            self._relays.extend((("rtp", rtp), ("rtcp", rtcp)))
            return rtp, rtcp
        raise OSError("no free pair of consecutive UDP ports for the relays")


def _swap(message: bytes, old: bytes, new: bytes) -> bytes:
    """`message` with the authority `old` replaced by `new` in its head and body, its Content-Length kept true."""
    head, sep, body = message.partition(b"\r\n\r\n")
    head = head.replace(old, new)
    if body and old in body:
        body = body.replace(old, new)
        head = re.sub(rb"(?im)^(Content-Length:\s*)\d+", lambda m: m.group(1) + str(len(body)).encode(), head)
    return head + sep + body


def _add(total: DirectionCounters, counters: DirectionCounters) -> None:
    total.datagrams_in += counters.datagrams_in
    total.bytes_in += counters.bytes_in
    total.delivered += counters.delivered
    total.bytes_delivered += counters.bytes_delivered
    total.dropped.update(counters.dropped)
