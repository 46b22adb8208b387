"""The impairing RTSP proxy between a real RTSP source (GStreamer's, as the benchmark's) and the ingest's own
client (FFmpeg through PyAV, as a stream pulls), over UDP and over TCP; and its TCP shaping on its own."""

import asyncio
import time
from collections.abc import Callable

import pytest

from app.bench.impair import DOWNSTREAM, Impairment
from app.bench.rtsp_impair import RtspImpairProxy, StreamShaper
from app.bench.rtsp_ingest_cell import StampedSource
from app.bench.server_bench import bench_clip
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.rtsp_in import IngestWorker, RtspTransport
from app.pipeline.types import Image

UNAVAILABLE = rtsp_unavailable_reason()
needs_rtsp = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")
OUTAGE = (1.0, 2.0)  # (start, length) in seconds after the impairment is applied


async def wait_for(done: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not done():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def pull_through_an_outage(transport: RtspTransport) -> tuple[list[float], float, RtspImpairProxy, str]:
    """The times the ingest worker decoded frames of the stamped source pulled through the proxy over
    `transport`, an outage applied once frames flow; when it was applied; the proxy; the worker's last state."""
    source = await asyncio.to_thread(StampedSource, bench_clip("480p", 10), 30)
    proxy = RtspImpairProxy(source.url, seed=3)
    decoded: list[float] = []

    def process(batch: list[Image]) -> list[Image]:
        decoded.extend(time.monotonic() for _ in batch)
        return batch

    worker: IngestWorker | None = None
    try:
        await proxy.start()
        worker = IngestWorker(proxy.url, process, None, transport=transport)
        worker.start()
        assert await wait_for(lambda: len(decoded) >= 15, 30), (worker.stats(), proxy.counters())
        applied = time.monotonic()
        proxy.impair(Impairment(outages=(OUTAGE,)))
        back = applied + sum(OUTAGE)
        assert await wait_for(lambda: sum(t > back + 0.5 for t in decoded) >= 10, 30), (worker.stats(), decoded[-5:])
        return list(decoded), applied, proxy, worker.state
    finally:
        if worker is not None:
            await asyncio.to_thread(worker.stop)
        await proxy.close()
        await asyncio.to_thread(source.close)


def longest_gap(times: list[float], since: float) -> tuple[float, float]:
    """The longest gap between consecutive times after `since`: (its length, when it began)."""
    after = [t for t in times if t >= since]
    return max((b - a, a) for a, b in zip(after, after[1:], strict=False))


@needs_rtsp
@pytest.mark.slow
@pytest.mark.alone
def test_rtp_over_udp_goes_through_the_relays_and_an_outage_stops_it_until_the_link_is_back() -> None:
    decoded, applied, proxy, state = asyncio.run(pull_through_an_outage("udp"))
    counters = proxy.counters()
    assert counters["setups"] == {"udp": 1} and counters["interleaved_frames"] == {}, counters
    rtp = counters["udp"]["rtp"][DOWNSTREAM]
    assert rtp["delivered"] > 100 and rtp["dropped"].get("outage", 0) > 20, rtp
    assert counters["udp"]["rtcp"]["client_to_server"]["delivered"] >= 1, "the client's reports went through too"
    gap, began = longest_gap(decoded, applied)
    # Nothing decoded through the outage; after it, once a keyframe came, frames again (state still running).
    assert gap >= 1.5 and began < applied + OUTAGE[0] + 0.5, (gap, began - applied)
    assert state == "running"


@needs_rtsp
@pytest.mark.slow
@pytest.mark.alone
def test_interleaved_rtp_over_tcp_is_held_through_an_outage_and_then_delivered() -> None:
    decoded, applied, proxy, state = asyncio.run(pull_through_an_outage("tcp"))
    counters = proxy.counters()
    assert counters["setups"] == {"tcp": 1} and counters["udp"] == {}, counters
    assert counters["interleaved_frames"][DOWNSTREAM] > 100, counters
    tcp = counters["tcp"][DOWNSTREAM]
    assert tcp["held"]["outage"] > 20 and tcp["dropped"] == {}, tcp
    gap, began = longest_gap(decoded, applied)
    assert gap >= 1.5 and began < applied + OUTAGE[0] + 0.5, (gap, began - applied)
    assert state == "running"


def test_a_tcp_direction_keeps_its_bytes_in_order_under_jitter_and_holds_them_through_an_outage() -> None:
    async def main() -> tuple[bytes, list[tuple[int, float]], float]:
        got = bytearray()
        arrivals: list[tuple[int, float]] = []  # (bytes so far, when)
        done = asyncio.Event()

        async def sink(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while chunk := await reader.read(65536):
                got.extend(chunk)
                arrivals.append((len(got), time.monotonic()))
            writer.close()
            done.set()

        server = await asyncio.start_server(sink, "127.0.0.1", 0)
        _, writer = await asyncio.open_connection(*server.sockets[0].getsockname()[:2])
        shaper = StreamShaper(writer, "7")
        started = time.monotonic()
        shaper.apply(Impairment(delay_ms=20.0, jitter_ms=15.0, outages=((0.2, 0.5),)), started)
        runner = asyncio.ensure_future(shaper.run())
        for i in range(100):
            await shaper.put(i.to_bytes(2, "big"))
            await asyncio.sleep(0.01)
        assert await wait_for(lambda: shaper.counters.delivered == 100, 10), shaper.counters
        runner.cancel()
        writer.close()
        await asyncio.wait_for(done.wait(), 10)
        server.close()
        assert shaper.held["outage"] > 0 and not shaper.counters.dropped
        return bytes(got), arrivals, started

    got, arrivals, started = asyncio.run(main())
    assert got == b"".join(i.to_bytes(2, "big") for i in range(100)), "every byte, in order"
    # Nothing crossed while the link was out (from 0.2 s to 0.7 s after it was applied, delay aside).
    assert not [t for _, t in arrivals if started + 0.25 <= t < started + 0.7], arrivals
