"""A UDP relay that impairs what passes through it, per direction: random loss, burst loss (Gilbert-Elliott),
delay with jitter (and so reordering), a bandwidth cap with a bounded queue, and scheduled outages.

It sits between a WebRTC client and a server on one machine (kernel traffic shaping needs privileges a benchmark
does not have): the client is told the server is at the relay's client-facing socket, the server is told the
client is at the relay's server-facing socket (`app.bench.sdp_route`), so ICE checks and media both pass through
it, as through a NAT that forwards one address pair.

Each direction draws its loss decisions from its own generator seeded from the relay's seed, so the same
datagrams meet the same losses in every run; what the cap drops depends on timing too.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, cast

Address = tuple[str, int]

UPSTREAM = "client_to_server"
DOWNSTREAM = "server_to_client"


@dataclass(frozen=True)
class GilbertElliott:
    """Two-state burst loss: in the bad state a datagram is lost with `loss_bad`, in the good one with
    `loss_good`; after each datagram the state flips with `p_good_bad` (good to bad) or `p_bad_good`."""

    p_good_bad: float
    p_bad_good: float
    loss_bad: float = 1.0
    loss_good: float = 0.0

    @classmethod
    def for_rate(cls, loss: float, mean_burst: float) -> GilbertElliott:
        """Bursts of `mean_burst` datagrams on average (every one lost), `loss` of all datagrams lost overall."""
        if not 0.0 < loss < 1.0 or mean_burst < 1.0:
            raise ValueError("loss must be in (0, 1) and mean_burst at least 1")
        p_bad_good = 1.0 / mean_burst
        return cls(p_good_bad=loss * p_bad_good / (1.0 - loss), p_bad_good=p_bad_good)

    @property
    def mean_loss(self) -> float:
        bad = self.p_good_bad / (self.p_good_bad + self.p_bad_good)
        return bad * self.loss_bad + (1.0 - bad) * self.loss_good


@dataclass(frozen=True)
class Impairment:
    """What one direction of the link does to datagrams. Outages are (start, duration) in seconds from the
    moment the impairment is applied."""

    loss: float = 0.0
    burst: GilbertElliott | None = None
    delay_ms: float = 0.0
    jitter_ms: float = 0.0  # each datagram's delay is uniform in delay_ms ± jitter_ms (never below 0)
    rate_bps: float | None = None  # the link's capacity; None: unlimited
    queue_ms: float = 150.0  # with a rate: a datagram that would wait longer than this for the link is dropped
    outages: tuple[tuple[float, float], ...] = ()

    def __post_init__(self) -> None:
        if not 0.0 <= self.loss <= 1.0:
            raise ValueError("loss must be between 0 and 1")
        if self.delay_ms < 0 or self.jitter_ms < 0 or self.queue_ms < 0:
            raise ValueError("delay, jitter and queue must not be negative")
        if self.rate_bps is not None and self.rate_bps <= 0:
            raise ValueError("rate must be positive")

    def in_outage(self, elapsed_s: float) -> bool:
        return self.outage_end(elapsed_s) is not None

    def outage_end(self, elapsed_s: float) -> float | None:
        """When the outage under way at `elapsed_s` ends (same clock), or None outside outages."""
        ends = [start + duration for start, duration in self.outages if start <= elapsed_s < start + duration]
        return max(ends) if ends else None


CLEAR = Impairment()


@dataclass
class DirectionCounters:
    datagrams_in: int = 0
    bytes_in: int = 0
    delivered: int = 0
    bytes_delivered: int = 0
    dropped: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "dropped": dict(self.dropped)}


class Direction:
    """One direction of the link: decides each datagram's fate and hands survivors to `deliver` on time."""

    def __init__(self, seed: int | str, deliver: Callable[[bytes], None], clock: Callable[[], float] = time.monotonic):
        self._rng = random.Random(seed)
        self._deliver = deliver
        self._clock = clock
        self.counters = DirectionCounters()
        self.impairment = CLEAR
        self._since = clock()
        self._bad = False  # Gilbert-Elliott state
        self._link_free_at = 0.0  # when the capped link finishes sending what it has queued
        self._pending: set[asyncio.TimerHandle] = set()

    def apply(self, impairment: Impairment) -> None:
        """Impair from now on as `impairment` says (its outages count from now); the queue and burst state go."""
        self.impairment = impairment
        self._since = self._clock()
        self._bad = False
        self._link_free_at = 0.0

    def _lost(self) -> str | None:
        impairment = self.impairment
        if impairment.burst is not None:
            model = impairment.burst
            lost = self._rng.random() < (model.loss_bad if self._bad else model.loss_good)
            flip = self._rng.random() < (model.p_bad_good if self._bad else model.p_good_bad)
            self._bad = self._bad != flip
            if lost:
                return "burst"
        if impairment.loss and self._rng.random() < impairment.loss:
            return "loss"
        return None

    def push(self, data: bytes) -> None:
        now = self._clock()
        counters = self.counters
        counters.datagrams_in += 1
        counters.bytes_in += len(data)
        impairment = self.impairment
        reason = "outage" if impairment.in_outage(now - self._since) else self._lost()
        wait = 0.0
        if reason is None and impairment.rate_bps is not None:
            start = max(now, self._link_free_at)
            done = start + len(data) * 8 / impairment.rate_bps
            if done - now > impairment.queue_ms / 1000.0:
                reason = "queue"
            else:
                self._link_free_at = done
                wait = done - now
        if reason is not None:
            counters.dropped[reason] += 1
            return
        if impairment.delay_ms or impairment.jitter_ms:
            spread = self._rng.uniform(-impairment.jitter_ms, impairment.jitter_ms)
            wait += max(0.0, impairment.delay_ms + spread) / 1000.0
        if wait <= 0.0:
            self._send(data)
            return
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle | None = None

        def later() -> None:
            if handle is not None:
                self._pending.discard(handle)
            self._send(data)

        handle = loop.call_later(wait, later)
        self._pending.add(handle)

    def _send(self, data: bytes) -> None:
        self.counters.delivered += 1
        self.counters.bytes_delivered += len(data)
        self._deliver(data)

    def cancel(self) -> None:
        for handle in self._pending:
            handle.cancel()
        self._pending.clear()


class _Endpoint(asyncio.DatagramProtocol):
    def __init__(self, received: Callable[[bytes, Address], None]) -> None:
        self._received = received
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self._received(data, addr)

    def send(self, data: bytes, addr: Address | None) -> None:
        if self.transport is not None and addr is not None and not self.transport.is_closing():
            self.transport.sendto(data, addr)


class UdpRelay:
    """Forwards datagrams between one client address and one server address through two local sockets.

    `client_facing` is where the client sends (it stands for the server); `server_facing` is where the server
    sends (it stands for the client). The peers' real addresses are set with `connect` (the client's may also
    be learnt from its first datagram); datagrams from anyone else are dropped as "stranger"."""

    def __init__(self, seed: int | str = 0, host: str = "127.0.0.1") -> None:
        self.host = host
        self.client: Address | None = None
        self.server: Address | None = None
        self.upstream = Direction(f"{seed}/{UPSTREAM}", self._to_server)
        self.downstream = Direction(f"{seed}/{DOWNSTREAM}", self._to_client)
        self._client_side = _Endpoint(self._from_client)
        self._server_side = _Endpoint(self._from_server)

    async def start(self, client_port: int = 0, server_port: int = 0) -> None:
        """Bind both sockets (on free ports unless given; OSError when a given one is taken)."""
        loop = asyncio.get_running_loop()
        await loop.create_datagram_endpoint(lambda: self._client_side, local_addr=(self.host, client_port))
        try:
            await loop.create_datagram_endpoint(lambda: self._server_side, local_addr=(self.host, server_port))
        except OSError:
            self.close()
            raise

    @property
    def client_facing(self) -> Address:
        return self._local(self._client_side)

    @property
    def server_facing(self) -> Address:
        return self._local(self._server_side)

    @staticmethod
    def _local(endpoint: _Endpoint) -> Address:
        assert endpoint.transport is not None, "start() the relay first"
        host, port = endpoint.transport.get_extra_info("sockname")[:2]
        return str(host), int(port)

    def connect(self, *, client: Address | None = None, server: Address | None = None) -> None:
        if client is not None:
            self.client = client
        if server is not None:
            self.server = server

    def impair(self, impairment: Impairment, downstream: Impairment | None = None) -> None:
        """Apply `impairment` to both directions (or `downstream` to the server-to-client one), from now."""
        self.upstream.apply(impairment)
        self.downstream.apply(impairment if downstream is None else downstream)

    def _from_client(self, data: bytes, addr: Address) -> None:
        if self.client is None:
            self.client = addr
        if addr != self.client:
            self.upstream.counters.dropped["stranger"] += 1
            return
        self.upstream.push(data)

    def _from_server(self, data: bytes, addr: Address) -> None:
        if addr != self.server:
            self.downstream.counters.dropped["stranger"] += 1
            return
        self.downstream.push(data)

    def _to_server(self, data: bytes) -> None:
        self._server_side.send(data, self.server)

    def _to_client(self, data: bytes) -> None:
        self._client_side.send(data, self.client)

    def counters(self) -> dict[str, dict[str, Any]]:
        return {UPSTREAM: self.upstream.counters.as_dict(), DOWNSTREAM: self.downstream.counters.as_dict()}

    def close(self) -> None:
        for direction in (self.upstream, self.downstream):
            direction.cancel()
        for endpoint in (self._client_side, self._server_side):
            if endpoint.transport is not None:
                endpoint.transport.close()
