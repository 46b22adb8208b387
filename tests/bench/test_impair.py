"""The impairing UDP relay on its own, with real sockets on loopback: each impairment does what it says, with
bounds loose enough for a loaded machine."""

import asyncio
import struct
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from app.bench.impair import DOWNSTREAM, UPSTREAM, GilbertElliott, Impairment, UdpRelay
from app.bench.sdp_route import NoCandidate, route_candidates

HEADER = struct.Struct("!Id")  # sequence number, send time since the test's start


class Sink(asyncio.DatagramProtocol):
    """A socket that keeps what it receives: (sequence number, sent at, received at), in arrival order."""

    def __init__(self) -> None:
        self.transport: Any = None
        self.got: list[tuple[int, float, float]] = []
        self.origin = 0.0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        seq, sent = HEADER.unpack_from(data)
        self.got.append((seq, sent, time.monotonic() - self.origin))

    @property
    def address(self) -> tuple[str, int]:
        return self.transport.get_extra_info("sockname")[:2]

    def seqs(self) -> list[int]:
        return [seq for seq, _, _ in self.got]


Scenario = Callable[[UdpRelay, Sink, Sink], Awaitable[None]]


def run_relay(scenario: Scenario, seed: int = 7) -> tuple[UdpRelay, Sink, Sink]:
    """A relay between a client socket and a server socket, both on loopback; `scenario` drives them."""

    async def main() -> tuple[UdpRelay, Sink, Sink]:
        loop = asyncio.get_running_loop()
        relay = UdpRelay(seed=seed)
        await relay.start()
        client, server = Sink(), Sink()
        await loop.create_datagram_endpoint(lambda: client, local_addr=("127.0.0.1", 0))
        await loop.create_datagram_endpoint(lambda: server, local_addr=("127.0.0.1", 0))
        relay.connect(client=client.address, server=server.address)
        try:
            await scenario(relay, client, server)
        finally:
            relay.close()
            client.transport.close()
            server.transport.close()
        return relay, client, server

    return asyncio.run(main())


async def send(
    sender: Sink, to: tuple[str, int], count: int, *, every_s: float = 0.0, size: int = 100, origin: float
) -> None:
    """`count` datagrams of `size` bytes, one every `every_s` seconds (in batches of 20 when 0, so that the
    receiving sockets' buffers never overflow)."""
    padding = b"\0" * max(0, size - HEADER.size)
    for seq in range(count):
        if every_s:
            due = origin + seq * every_s
            if due > time.monotonic():
                await asyncio.sleep(due - time.monotonic())
        elif seq % 20 == 0:
            await asyncio.sleep(0.002)
        sender.transport.sendto(HEADER.pack(seq, time.monotonic() - origin) + padding, to)


async def settle(seconds: float = 0.3) -> None:
    await asyncio.sleep(seconds)


def upstream(impairment: Impairment, count: int, **kwargs: Any) -> Scenario:
    async def scenario(relay: UdpRelay, client: Sink, server: Sink) -> None:
        relay.impair(impairment, downstream=Impairment())
        server.origin = origin = time.monotonic()
        await send(client, relay.client_facing, count, origin=origin, **kwargs)
        await settle()

    return scenario


def test_a_clear_relay_forwards_everything_both_ways_in_order() -> None:
    async def scenario(relay: UdpRelay, client: Sink, server: Sink) -> None:
        origin = client.origin = server.origin = time.monotonic()
        await send(client, relay.client_facing, 200, origin=origin)
        await send(server, relay.server_facing, 150, origin=origin)
        await settle()

    relay, client, server = run_relay(scenario)
    assert server.seqs() == list(range(200)) and client.seqs() == list(range(150))
    counters = relay.counters()
    assert counters[UPSTREAM]["datagrams_in"] == counters[UPSTREAM]["delivered"] == 200
    assert counters[UPSTREAM]["bytes_in"] == counters[UPSTREAM]["bytes_delivered"] == 200 * 100
    assert counters[DOWNSTREAM]["delivered"] == 150 and counters[DOWNSTREAM]["dropped"] == {}


def test_random_loss_drops_the_configured_share_and_the_same_datagrams_for_the_same_seed() -> None:
    relay, _, server = run_relay(upstream(Impairment(loss=0.1), 3000))
    dropped = relay.counters()[UPSTREAM]["dropped"]["loss"]
    assert 0.08 * 3000 <= dropped <= 0.12 * 3000
    assert len(server.got) == 3000 - dropped
    again = run_relay(upstream(Impairment(loss=0.1), 3000))[2]
    other_seed = run_relay(upstream(Impairment(loss=0.1), 3000), seed=8)[2]
    assert again.seqs() == server.seqs() and other_seed.seqs() != server.seqs()


def _lost_runs(received: list[int], count: int) -> list[int]:
    """Lengths of the runs of consecutive sequence numbers that did not arrive."""
    got = set(received)
    runs, current = [], 0
    for seq in range(count):
        if seq in got:
            if current:
                runs.append(current)
            current = 0
        else:
            current += 1
    return runs + ([current] if current else [])


def test_burst_loss_loses_the_configured_share_in_bursts() -> None:
    model = GilbertElliott.for_rate(0.05, mean_burst=5)
    assert model.mean_loss == pytest.approx(0.05)
    relay, _, server = run_relay(upstream(Impairment(burst=model), 4000))
    assert relay.counters()[UPSTREAM]["dropped"]["burst"] == 4000 - len(server.got)
    assert 0.025 <= 1 - len(server.got) / 4000 <= 0.075
    runs = _lost_runs(server.seqs(), 4000)
    assert sum(runs) / len(runs) >= 3.0  # independent 5% losses would average about 1.05

    _, _, independent = run_relay(upstream(Impairment(loss=0.05), 4000))
    runs = _lost_runs(independent.seqs(), 4000)
    assert sum(runs) / len(runs) < 1.5


def test_a_rate_cap_delivers_no_more_than_the_cap_and_drops_beyond_its_queue() -> None:
    rate, size = 400_000, 1000  # 50 datagrams a second fit; 100 a second are sent for 1.5 s
    impairment = Impairment(rate_bps=rate, queue_ms=100.0)
    relay, _, server = run_relay(upstream(impairment, 150, every_s=0.01, size=size))
    counters = relay.counters()[UPSTREAM]
    assert counters["dropped"].get("queue", 0) >= 40
    delivered_bits = len(server.got) * size * 8
    # What the link could carry while the datagrams came in, plus its queue.
    assert delivered_bits <= rate * (1.5 + 0.1) + size * 8
    span = server.got[-1][2] - server.got[0][2]
    assert (delivered_bits - size * 8) / span <= rate * 1.1
    assert delivered_bits >= 0.6 * rate * 1.5
    assert max(received - sent for _, sent, received in server.got) < 0.1 + 0.15  # queue bound, loop slack


def test_an_outage_drops_everything_in_its_window_and_nothing_outside() -> None:
    impairment = Impairment(outages=((0.4, 0.6),))
    relay, _, server = run_relay(upstream(impairment, 150, every_s=0.01))
    sent_at = {seq: sent for seq, sent, _ in server.got}
    assert not [seq for seq, sent in sent_at.items() if 0.5 <= sent < 0.9]
    assert all(seq in sent_at for seq in range(0, 30)), "before the outage everything arrives"
    assert all(seq in sent_at for seq in range(110, 150)), "after it everything arrives again"
    assert relay.counters()[UPSTREAM]["dropped"]["outage"] >= 40


def test_jitter_delays_within_its_range_and_reorders() -> None:
    impairment = Impairment(delay_ms=20.0, jitter_ms=15.0)
    relay, _, server = run_relay(upstream(impairment, 200, every_s=0.002))
    assert sorted(server.seqs()) == list(range(200)), "jitter loses nothing"
    inversions = sum(1 for a, b in zip(server.seqs(), server.seqs()[1:], strict=False) if b < a)
    assert inversions >= 10
    delays = sorted(received - sent for _, sent, received in server.got)
    assert delays[0] >= 0.004 and delays[len(delays) // 2] >= 0.012


def test_datagrams_from_unknown_addresses_are_dropped() -> None:
    async def scenario(relay: UdpRelay, client: Sink, server: Sink) -> None:
        stranger = Sink()
        await asyncio.get_running_loop().create_datagram_endpoint(lambda: stranger, local_addr=("127.0.0.1", 0))
        origin = time.monotonic()
        await send(stranger, relay.client_facing, 5, origin=origin)
        await send(stranger, relay.server_facing, 5, origin=origin)
        await settle(0.1)
        stranger.transport.close()

    relay, client, server = run_relay(scenario)
    assert not client.got and not server.got
    assert relay.counters()[UPSTREAM]["dropped"] == {"stranger": 5}
    assert relay.counters()[DOWNSTREAM]["dropped"] == {"stranger": 5}


def test_impairments_are_checked() -> None:
    with pytest.raises(ValueError):
        Impairment(loss=1.5)
    with pytest.raises(ValueError):
        Impairment(rate_bps=0)
    with pytest.raises(ValueError):
        GilbertElliott.for_rate(0.0, 3)


OFFER = "\r\n".join(
    [
        "v=0",
        "o=- 1 1 IN IP4 0.0.0.0",
        "m=video 50000 UDP/TLS/RTP/SAVPF 97",
        "c=IN IP4 127.0.0.1",
        "a=candidate:a1 1 udp 2130706431 127.0.0.1 50000 typ host",
        "a=candidate:b2 1 udp 1694498815 203.0.113.9 61000 typ srflx raddr 127.0.0.1 rport 50000",
        "a=candidate:c3 1 tcp 1518280447 127.0.0.1 9 typ host tcptype active",
        "a=end-of-candidates",
        "",
    ]
)


def test_route_candidates_names_the_relay_and_returns_the_real_address() -> None:
    routed, real = route_candidates(OFFER, ("127.0.0.1", 40000))
    assert real == ("127.0.0.1", 50000)
    candidates = [line for line in routed.splitlines() if line.startswith("a=candidate:")]
    assert candidates == ["a=candidate:a1 1 udp 2130706431 127.0.0.1 40000 typ host"]
    assert "a=end-of-candidates" in routed and routed.endswith("\r\n")
    with pytest.raises(NoCandidate):
        route_candidates("v=0\r\nm=video 9 UDP/TLS/RTP/SAVPF 97\r\n", ("127.0.0.1", 1))
