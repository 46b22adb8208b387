"""`swapcast bench-network`'s run: the profiles checked, one server started, then every path asked for
against it (the WebRTC session and WHEP viewer paths of `app.bench.network_bench`, the RTSP-ingest paths of
`app.bench.network_rtsp`), in one report. Kept apart from both so that neither imports the other's runner."""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from app.bench.network_bench import AIORTC_LIMITS, PROFILES, NetworkBenchConfig, run_rtc_paths
from app.bench.network_paths import PATHS, RTSP_PATHS
from app.bench.network_rtsp import run_rtsp_paths
from app.bench.server_bench import (
    RESOLUTIONS,
    BenchServer,
    ServerProcess,
    ThreadServer,
    bench_clip,
    engine_unavailable,
    machine_report,
    upload_identity,
)
from app.pipeline.types import Image


async def _run_paths(
    server: BenchServer, frames: list[Image], config: NetworkBenchConfig, progress: bool
) -> list[dict[str, Any]]:
    rows = await run_rtc_paths(server, frames, config, progress)
    if set(config.paths) & set(RTSP_PATHS):
        rows.extend(await run_rtsp_paths(server, frames, config, progress))
    return rows


def run_network_bench(config: NetworkBenchConfig, progress: bool = True) -> dict[str, Any]:
    unknown = [p for p in config.profiles if p not in PROFILES]
    if unknown:
        raise ValueError(f"unknown profile {unknown[0]!r}")
    if not set(config.paths) <= set(PATHS):
        raise ValueError(f"unknown path in {config.paths!r}: {', '.join(PATHS)}")
    if config.profiles[:1] != ("clean",):
        # Every profile is compared with the clean run: it comes first.
        config = replace(config, profiles=("clean", *(p for p in config.profiles if p != "clean")))
    reason = engine_unavailable(config.engine)
    rtsp = bool(set(config.paths) & set(RTSP_PATHS))
    if reason is None and rtsp:
        from app.egress.rtsp import rtsp_unavailable_reason

        unavailable = rtsp_unavailable_reason()
        reason = f"the RTSP paths need GStreamer's RTSP server: {unavailable}" if unavailable else None
    if reason is not None:
        raise RuntimeError(reason)
    from app.media.encoder import install_timed_encoders
    from app.media.peer import use_host_addresses

    install_timed_encoders()  # the client encodes in real time, as a browser does
    use_host_addresses(["127.0.0.1"])  # one loopback candidate for the relay to stand in for
    frames = bench_clip(config.resolution, config.clip_frames)
    started = time.perf_counter()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="swapcast-bench-network-") as tmp:
        server: BenchServer = (ThreadServer if config.in_process else ServerProcess)(
            config.engine, Path(tmp) / "id", rtsp=rtsp
        )
        try:
            upload_identity(server)
            rows = asyncio.run(_run_paths(server, frames, config, progress))
        finally:
            server.stop()
    return {
        "config": {
            "profiles": list(config.profiles),
            "seconds": config.seconds,
            "warmup": config.warmup,
            "resolution": config.resolution,
            "size": list(RESOLUTIONS[config.resolution]),
            "fps": config.fps,
            "seed": config.seed,
            "engine": config.engine,
            "codec": config.codec,
            "paths": list(config.paths),
            "client_recovery": config.client_recovery,
        },
        "machine": machine_report(load_before[0]),
        "profiles": rows,
        "aiortc": list(AIORTC_LIMITS),
        "seconds": round(time.perf_counter() - started, 1),
    }
