"""The RTSP-ingest paths of `swapcast bench-network`: `rtsp-udp` and `rtsp-tcp`.

Per profile, a fresh stream (`POST /v1/streams`, `source_transport` udp or tcp) pulls the benchmark's stamped RTSP
source (`app.bench.rtsp_ingest_cell.StampedSource`) through `app.bench.rtsp_impair.RtspImpairProxy`, which applies
the profile to the source's link; the stream's RTSP output is read over a clear loopback connection. Frames are
timed from their push into the source to their decoded arrival at the output's reader, and reported as a session's
are (`app.bench.network_bench.summarize`) against the path's clean run. Where a session reports RTCP feedback, a
stream reports none (FFmpeg's RTSP client sends NACK and keyframe requests only to an RTP/AVPF source, which this
one is not); its `server_recovery` is the stream's own report: state, reopens of the source, frames decoded and
dropped. Over TCP, loss does not apply (see the proxy): a loss profile there is the clean link.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx

from app.bench.impair import CLEAR, DOWNSTREAM, UPSTREAM
from app.bench.network_bench import (
    FRESH_WAIT_S,
    LIFT_WATCH_S,
    PROFILES,
    NetworkBenchConfig,
    Profile,
    Run,
    Sample,
    summarize,
)
from app.bench.network_paths import path_summary
from app.bench.rtc_client import Received, RoundTrip
from app.bench.rtsp_impair import RtspImpairProxy
from app.bench.rtsp_ingest_cell import FIRST_FRAME_S, OutputReader, StampedSource, output_url
from app.bench.server_bench import BenchServer, print_progress
from app.media.rtsp_in import RtspTransport
from app.pipeline.types import Image

TRANSPORTS: dict[str, RtspTransport] = {"rtsp-udp": "udp", "rtsp-tcp": "tcp"}


class StreamClient:
    """What `summarize` reads of a client: the round trip, here the distinct frames the output returned (the
    first arrival of each push; the output repeats its last frame while the server is behind)."""

    def __init__(self, reader: OutputReader | None, source: StampedSource) -> None:
        self.result = RoundTrip(sent_at=dict(source.sent_at))
        if reader is None:
            return
        seen: set[tuple[int, float]] = set()
        for value, pushed, at in list(reader.received):
            if (value, pushed) not in seen:
                seen.add((value, pushed))
                self.result.received.append(Received(value, at, None))
        self.result.unreadable = reader.unreadable


async def _sample(proxy: RtspImpairProxy, run: Run) -> None:
    """Each second, the bytes that reached the proxy from the client (UDP and TCP) and from the source."""
    while True:
        counters = proxy.counters()
        flows = [*counters["udp"].values(), counters["tcp"]]
        sent = {name: sum(flow.get(name, {}).get("bytes_in", 0) for flow in flows) for name in (UPSTREAM, DOWNSTREAM)}
        run.samples.append(Sample(time.monotonic(), sent[UPSTREAM], sent[DOWNSTREAM]))
        await asyncio.sleep(1.0)


async def _watch_stream(http: httpx.AsyncClient, location: str, run: Run) -> None:
    """Poll the stream: its state changes and its worker's counters."""
    while True:
        with contextlib.suppress(httpx.HTTPError, ValueError):
            response = await http.get(location)
            if response.status_code == 200:
                body = response.json()
                worker = body.get("stats") or {}
                run.recovery = {k: worker.get(k) for k in ("reconnects", "frames_in", "dropped", "last_error")} | {
                    "state": body.get("state")
                }
                state = {"state": body.get("state"), "close_reason": body.get("reason")}
                if not run.session_states or {k: run.session_states[-1][k] for k in state} != state:
                    run.session_states.append(state | {"at": time.monotonic()})
        await asyncio.sleep(0.5)


async def _wait_pushed_after(reader: OutputReader, moment: float, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not reader.got_pushed_after(moment):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def run_rtsp_profile(
    server: BenchServer, frames: list[Image], profile: Profile, config: NetworkBenchConfig, transport: RtspTransport
) -> tuple[StreamClient, Run]:
    """One stream pulling the stamped source over `transport` through a proxy impairing as `profile` says."""
    run = Run()
    source = await asyncio.to_thread(StampedSource, frames, config.fps)
    proxy = RtspImpairProxy(source.url, seed=config.seed)
    reader: OutputReader | None = None
    tasks: list[asyncio.Future[None]] = []
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        location: str | None = None
        try:
            await proxy.start()
            body = {"source_url": proxy.url, "identity": server.identity, "source_transport": transport}
            created = await http.post("/v1/streams", json=body)
            if created.status_code != 201:
                run.failed = f"POST /v1/streams answered {created.status_code}: {created.text[:200]}"
                return StreamClient(None, source), run
            location = f"/v1/streams/{created.json()['id']}"
            reader = OutputReader(await output_url(http, location), source.sent_at)
            if not await asyncio.to_thread(reader.first.wait, FIRST_FRAME_S) or not reader.received:
                run.failed = reader.error or f"no frame came back within {FIRST_FRAME_S:.0f} s"
                return StreamClient(reader, source), run
            await asyncio.sleep(config.warmup)
            run.start = time.monotonic()
            proxy.impair(profile.applied(config.seconds))
            tasks = [
                asyncio.ensure_future(_sample(proxy, run)),
                asyncio.ensure_future(_watch_stream(http, location, run)),
            ]
            run.end = run.start + profile.window_s(config.seconds)
            await asyncio.sleep(run.end - time.monotonic())
            if profile.lift:
                proxy.impair(CLEAR)
                run.lifted_at = time.monotonic()
                await asyncio.sleep(LIFT_WATCH_S)
            elif profile.outage_s:
                await _wait_pushed_after(reader, run.start + config.seconds / 2 + profile.outage_s, FRESH_WAIT_S)
            else:
                # The output keeps the source's order: once a frame pushed after the window is back, none of
                # the window's frames is still on its way.
                await _wait_pushed_after(reader, run.end, FRESH_WAIT_S)
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            run.failed = f"{type(exc).__name__}: {exc}"
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if location is not None:
                with contextlib.suppress(httpx.HTTPError):
                    await http.delete(location)
            if reader is not None:
                await asyncio.to_thread(reader.close)
            await proxy.close()
            await asyncio.to_thread(source.close)
    run.relay = proxy.counters()
    return StreamClient(reader, source), run


async def run_rtsp_paths(
    server: BenchServer, frames: list[Image], config: NetworkBenchConfig, progress: bool
) -> list[dict[str, Any]]:
    """Every profile asked for (clean first) on each RTSP path asked for."""
    rows: list[dict[str, Any]] = []
    for path in (p for p in TRANSPORTS if p in config.paths):
        clean: dict[str, Any] | None = None
        for name in config.profiles:
            profile = PROFILES[name]
            client, run = await run_rtsp_profile(server, frames, profile, config, TRANSPORTS[path])
            summary = summarize(profile, client, run, config, clean) | {"feedback": None}
            summary["transport"] = TRANSPORTS[path]
            if name == "clean":
                clean = summary
            rows.append(path_summary(summary, path))
            if progress:
                print_progress(
                    f"{path}/{name:>9}",
                    summary["latency_ms"],
                    f"{summary['fps']} fps, freezes {summary['freezes']['count']} "
                    f"(longest {summary['freezes']['longest_ms']} ms)",
                    run.failed,
                )
            await asyncio.sleep(0.5)
    return rows
