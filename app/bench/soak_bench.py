"""`swapcast bench-soak`: one server for N minutes under churn, its resources sampled all along.

One server is started in a child process (as `swapcast bench-server` starts them, RTSP on). The load
(`app.bench.soak_load`) joins and leaves in cycles: WebRTC sessions (one publishing into a channel made for the
run), an RTSP-ingest stream, WHEP viewers, RTSP pullers, identity switches, uploads and deletes. One warm-up
cycle comes first; the idle server after it is the baseline. Every `sample_s` the server's resident memory,
threads, open files and child processes are read from /proc, and its event-loop tasks, sessions, streams,
WHEP viewers and RTSP clients from `/metrics`.

The report: per window, frames per second per client and latency of each kind of client; per resource, its
growth per hour after `warmup_minutes` (a least-squares slope over the samples), its baseline and its value once
every client has left; and the checks against the targets (RSS growth, everything back to its baseline, the
last window's fps against the first's, no error).
"""

from __future__ import annotations

import asyncio
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import cv2
import httpx
import numpy as np

from app.bench.rtsp_ingest_cell import StampedSource, latency_summary
from app.bench.server_bench import (
    RESOLUTIONS,
    ServerProcess,
    bench_clip,
    engine_unavailable,
    machine_report,
)
from app.bench.soak_load import Record, Run, create_channel, cycle, upload
from app.runtime.allocator import JEMALLOC_SONAME, find_jemalloc, jemalloc_loaded, preload_env

CHANNEL = "soak"
PROC_KEYS = ("rss_mb", "threads", "open_files", "children")
METRIC_KEYS = {
    "tasks": "swapcast_event_loop_tasks",
    "sessions": "swapcast_sessions_active",
    "streams": "swapcast_streams_active",
    "whep_viewers": "swapcast_whep_viewers",
    "rtsp_clients": "swapcast_rtsp_clients",
}
# Back at the baseline once the clients have left: within these (threads and files may differ by pool threads
# started or ended meanwhile; everything the clients held must be gone).
RETURN_SLACK = {"threads": 2, "open_files": 4, "children": 0, "tasks": 2} | {
    k: 0 for k in ("sessions", "streams", "whep_viewers", "rtsp_clients")
}
RSS_TARGET_MB_PER_H = 10.0
FPS_TARGET_RATIO = 0.95


@dataclass(frozen=True)
class SoakConfig:
    minutes: float = 10.0
    warmup_minutes: float = 5.0  # slopes are fitted after this (capped at a third of the run)
    sessions: int = 2
    hold_s: float = 30.0  # how long the clients stay before they leave
    pause_s: float = 3.0  # between a leave and the next join
    patch_every_s: float = 5.0
    sample_s: float = 5.0
    window_s: float = 60.0
    settle_s: float = 20.0  # idle after the last leave before the end figures
    resolution: str = "480p"
    fps: int = 15
    engine: str = "mesh"
    clip_frames: int = 60
    malloc_arena_max: int | None = None  # MALLOC_ARENA_MAX for the server, to tell fragmentation from leaks
    allocator: str = "system"  # or "jemalloc": preloaded into the server (app.runtime.allocator)


@dataclass
class Samples:
    rows: list[dict[str, float]] = field(default_factory=list)
    phases: list[tuple[str, float]] = field(default_factory=list)  # (name, start), monotonic


# ------------------------------------------------------------------------------------------------- sampling


def proc_figures(pid: int) -> dict[str, float]:
    """Resident memory (MB), threads, open files and child processes of `pid`, from /proc (Linux)."""
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    children = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children += 1
    return {
        "rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024.0, 1),
        "threads": float(int(fields["Threads"])),
        "open_files": float(len(os.listdir(f"/proc/{pid}/fd"))),
        "children": float(children),
    }


def metric_figures(text: str) -> dict[str, float]:
    out = {}
    for key, name in METRIC_KEYS.items():
        match = re.search(rf"^{name}\s+([0-9.eE+-]+)$", text, re.M)
        if match:
            out[key] = float(match[1])
    return out


async def sampler(pid: int, base_url: str, every_s: float, samples: Samples) -> None:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        while True:
            row: dict[str, float] = {"t": time.monotonic()}
            try:
                row |= await asyncio.to_thread(proc_figures, pid)
                row |= metric_figures((await http.get("/metrics")).text)
            except (OSError, httpx.HTTPError, ValueError, KeyError):
                pass  # a missed sample; the next one comes
            samples.rows.append(row)
            await asyncio.sleep(every_s)


# ------------------------------------------------------------------------------------------------- summary


def slope_per_hour(rows: list[dict[str, float]], key: str, after: float, before: float) -> float | None:
    """Least-squares growth of `key` per hour over the samples in [after, before) (monotonic)."""
    points = [(r["t"], r[key]) for r in rows if after <= r["t"] < before and key in r]
    if len(points) < 3 or points[-1][0] - points[0][0] <= 0:
        return None
    t, v = np.asarray(points).T
    return round(float(np.polyfit((t - t[0]) / 3600.0, v, 1)[0]), 2)


def level(rows: list[dict[str, float]], key: str, start: float, end: float) -> float | None:
    """The median of `key` over the samples in [start, end)."""
    values = [r[key] for r in rows if start <= r["t"] < end and key in r]
    return round(float(np.median(values)), 1) if values else None


def windows(record: Record, start: float, end: float, window_s: float) -> list[dict[str, Any]]:
    """Per window of the churn: for each kind of client, frames returned per second of connected client and
    latency percentiles."""
    out = []
    kinds = sorted({p.kind for p in record.presence})
    lo = start
    while lo < end - 1e-6:
        hi = min(end, lo + window_s)
        row: dict[str, Any] = {"from_s": round(lo - start), "to_s": round(hi - start)}
        for kind in kinds:
            connected = sum(max(0.0, min(hi, p.left) - max(lo, p.joined)) for p in record.presence if p.kind == kind)
            inside = [a for a in record.arrivals if a.kind == kind and lo <= a.at < hi]
            row[kind] = {
                "fps": round(len(inside) / connected, 1) if connected > 0 else None,
                "latency_ms": latency_summary([a.latency_ms for a in inside if a.latency_ms is not None]),
            }
        out.append(row)
        lo = hi
    return out


def resources(
    samples: Samples, fit: tuple[float, float], baseline: tuple[float, float], idle: tuple[float, float]
) -> dict[str, dict[str, float | None]]:
    out = {}
    for key in (*PROC_KEYS, *METRIC_KEYS):
        base, end = level(samples.rows, key, *baseline), level(samples.rows, key, *idle)
        peak = max((r[key] for r in samples.rows if key in r), default=None)
        out[key] = {
            "baseline": base,
            "after_leave": end,
            "peak": peak,
            "slope_per_hour": slope_per_hour(samples.rows, key, *fit),
        }
    return out


def checks(result: dict[str, Any]) -> dict[str, Any]:
    res, wins = result["resources"], result["windows"]
    out: dict[str, Any] = {}
    rss = res["rss_mb"]["slope_per_hour"]
    out["rss_growth_mb_per_h"] = {"value": rss, "target": RSS_TARGET_MB_PER_H, "ok": rss is not None and rss <= 10}
    for key, slack in RETURN_SLACK.items():
        base, end = res[key]["baseline"], res[key]["after_leave"]
        ok = base is not None and end is not None and end <= base + slack
        out[f"{key}_back_to_baseline"] = {"baseline": base, "after_leave": end, "slack": slack, "ok": ok}
    full = [w for w in wins if w["to_s"] - w["from_s"] >= 0.5 * result["config"]["window_s"]]
    first, last = (full[0], full[-1]) if full else (None, None)
    for kind in ("session", "rtsp_stream"):
        a = first.get(kind, {}).get("fps") if first else None
        b = last.get(kind, {}).get("fps") if last else None
        ratio = round(b / a, 2) if a and b is not None else None
        out[f"{kind}_fps_last_vs_first"] = {
            "first": a,
            "last": b,
            "ratio": ratio,
            "ok": ratio is not None and ratio >= FPS_TARGET_RATIO,
        }
    out["no_errors"] = {"count": len(result["errors"]), "ok": not result["errors"]}
    logged = result.get("server_log_errors", [])
    out["no_errors_logged"] = {"count": len(logged), "ok": not logged}
    out["all_ok"] = all(v["ok"] for v in out.values() if isinstance(v, dict))
    return out


# ------------------------------------------------------------------------------------------------- run


async def _soak(run: Run, pid: int, config: SoakConfig, progress: Callable[[str], None]) -> dict[str, Any]:
    samples = Samples()
    sampling = asyncio.ensure_future(sampler(pid, run.base_url, config.sample_s, samples))
    try:
        progress("warm-up cycle")
        await cycle(run, config.sessions, min(config.hold_s, 15.0), config.patch_every_s)
        await asyncio.sleep(config.settle_s)
        base_from = time.monotonic()
        idle_s = max(2 * config.sample_s, 10.0)
        await asyncio.sleep(idle_s)
        start = time.monotonic()
        end = start + config.minutes * 60.0
        joins = 0
        while time.monotonic() < end:
            hold = min(config.hold_s, max(5.0, end - time.monotonic()))
            await cycle(run, config.sessions, hold, config.patch_every_s)
            joins += 1
            progress(f"cycle {joins}: {round(time.monotonic() - start)} s, {samples.rows[-1].get('rss_mb')} MB")
            await asyncio.sleep(config.pause_s)
        churn_end = time.monotonic()
        # Measured as the baseline was: as long after the leave, for as long (the channel stays for both).
        await asyncio.sleep(config.settle_s)
        idle_from = time.monotonic()
        await asyncio.sleep(idle_s)
        idle_to = time.monotonic() + 0.1
    finally:
        sampling.cancel()
        await asyncio.gather(sampling, return_exceptions=True)
    fit_from = start + min(config.warmup_minutes * 60.0, (end - start) / 3)
    first_join = samples.rows[0]["t"] if samples.rows else start
    return {
        "cycles": joins,
        "windows": windows(run.record, start, churn_end, config.window_s),
        "resources": resources(samples, (fit_from, churn_end), (base_from, start), (idle_from, idle_to)),
        "rss_per_cycle_mb": _per_cycle(samples.rows, start, churn_end, joins),
        "samples": [{k: (round(v - first_join, 1) if k == "t" else v) for k, v in row.items()} for row in samples.rows],
    }


def _per_cycle(rows: list[dict[str, float]], start: float, end: float, cycles: int) -> float | None:
    a, b = level(rows, "rss_mb", start - 15, start), level(rows, "rss_mb", end - 10, end + 1)
    return round((b - a) / cycles, 2) if a is not None and b is not None and cycles else None


def run_soak_bench(config: SoakConfig, progress: bool = True) -> dict[str, Any]:
    reason = engine_unavailable(config.engine)
    if reason is not None:
        raise RuntimeError(reason)
    from app.egress.rtsp import rtsp_unavailable_reason
    from app.media.clips import load_sample
    from app.media.encoder import install_timed_encoders
    from app.media.peer import use_host_addresses

    if (why := rtsp_unavailable_reason()) is not None:
        raise RuntimeError(f"the soak needs GStreamer RTSP: {why}")
    install_timed_encoders()
    use_host_addresses(["127.0.0.1"])
    frames = bench_clip(config.resolution, config.clip_frames)
    ok, png = cv2.imencode(".png", load_sample("tom_hanks"))
    if not ok:
        raise RuntimeError("cannot encode the identity photo")
    say: Callable[[str], None] = (
        (lambda text: print(text, file=sys.stderr, flush=True)) if progress else (lambda text: None)
    )
    started, load_before = time.perf_counter(), os.getloadavg()
    env_before = dict(os.environ)
    os.environ.update(server_env(config))
    with tempfile.TemporaryDirectory(prefix="swapcast-bench-soak-") as tmp, open(Path(tmp) / "server.log", "w+") as log:
        try:
            server = ServerProcess(config.engine, Path(tmp) / "id", rtsp=True, log=log)
        finally:
            os.environ.clear()
            os.environ.update(env_before)
        allocator = "jemalloc" if jemalloc_loaded(server.process.pid) else "system"
        if allocator != config.allocator:
            server.stop()
            raise RuntimeError(f"the server runs on the {allocator} allocator, not {config.allocator}")
        source = StampedSource(frames, config.fps)
        try:
            report = asyncio.run(_with_server(server, source, png.tobytes(), frames, config, say))
        finally:
            source.close()
            server.stop()
        log.seek(0)
        report["server_log_errors"] = log_errors(log.read())
    report["config"] = {k: getattr(config, k) for k in SoakConfig.__dataclass_fields__} | {
        "size": list(RESOLUTIONS[config.resolution])
    }
    report["allocator"] = allocator
    report["machine"] = machine_report(load_before[0])
    report["seconds"] = round(time.perf_counter() - started, 1)
    report["checks"] = checks(report)
    return report


async def _with_server(
    server: ServerProcess,
    source: StampedSource,
    photo: bytes,
    frames: list[Any],
    config: SoakConfig,
    say: Callable[[str], None],
) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        identities = (await upload(http, photo), await upload(http, photo))
        await create_channel_sized(http, config)
    run = Run(server.base_url, identities, CHANNEL, photo, frames, config.fps, source)
    report = await _soak(run, server.process.pid, config, say)
    report["operations"] = run.record.operations
    report["errors"] = run.record.errors[:50]
    return report


async def create_channel_sized(http: httpx.AsyncClient, config: SoakConfig) -> None:
    width, height = RESOLUTIONS[config.resolution]
    await create_channel(http, {"name": CHANNEL, "width": width, "height": height, "fps": config.fps})


def log_errors(text: str) -> list[str]:
    """The server's log lines at ERROR or worse, and the first line of each traceback (at most 50)."""
    lines = text.splitlines()
    found = [line for line in lines if re.match(r"(ERROR|CRITICAL)\b", line) or line.startswith("Traceback")]
    return [line[:300] for line in found[:50]]


def server_env(config: SoakConfig) -> dict[str, str]:
    """What the server child's environment has on top of this process's: the allocator asked for (the system one
    explicitly, so that `swapcast serve`'s own choice cannot differ from the bench's) and MALLOC_ARENA_MAX."""
    env: dict[str, str] = {"SWAPCAST_ALLOCATOR": config.allocator}
    if config.malloc_arena_max is not None:
        env["MALLOC_ARENA_MAX"] = str(config.malloc_arena_max)
    if config.allocator == "jemalloc":
        library = find_jemalloc()
        if library is None:
            raise RuntimeError(f"--allocator jemalloc: {JEMALLOC_SONAME} is not installed (package libjemalloc2)")
        env |= {k: v for k, v in preload_env(os.environ, library).items() if k in ("LD_PRELOAD", "MALLOC_CONF")}
    return env
