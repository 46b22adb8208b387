"""`swapcast bench-network`: one session of our server per network profile, through an impairing UDP relay.

One server is started (as `swapcast bench-server` starts them); then, one after another, each profile gets a
fresh session whose media and ICE pass through `app.bench.impair.UdpRelay`, with the profile's impairment on
both directions for the measuring window. Per profile: frames returned per second, freezes (gaps between
returned frames over 250 ms), round-trip latency from the stamped frame ids, keyframe requests and NACKs each
side sent, both senders' bitrate each second (the client's from its `getStats()` outbound-rtp bytesSent, the
server's from what the relay received from it), and, against the clean run, the fps and latency ratios.

Outage profiles drop everything for a while halfway through the window and report how long fresh frames (sent
after the link came back) took to return; one longer than the server's media timeout reports how the session
ended and whether its slot came back (a new session opens and returns frames). The cap profile lifts the cap
after the window and reports how long the stream took to recover.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import httpx
import numpy as np

from app.bench.impair import CLEAR, GilbertElliott, Impairment, UdpRelay
from app.bench.network_paths import (
    RelayedClient,
    RelayedViewer,
    path_summary,
    viewer_stats,
    whep_profiles,
)
from app.bench.rtc_client import RoundTrip
from app.bench.rtsp_ingest_cell import latency_summary
from app.bench.server_bench import (
    BenchServer,
    print_progress,
)
from app.pipeline.types import Image

FREEZE_S = 0.25  # a gap between returned frames longer than this is a freeze
FRESH_WAIT_S = 10.0  # after an outage, how long to wait for a fresh frame beyond the window
LIFT_WATCH_S = 12.0  # after the cap lifts, how long recovery is watched
RECOVERED_FPS = 0.9  # a second with this share of the clean fps (and latency near clean) counts as recovered
SETTLE_AFTER_S = 5.0  # under the cap, latency is also reported for the window after this
CAP_BPS = 1_500_000
SLOT_WAIT_S = 30.0


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    impairment: Impairment = CLEAR
    outage_s: float = 0.0  # drop everything this long, starting halfway through the window
    lift: bool = False  # after the window the impairment lifts and recovery is watched

    def window_s(self, seconds: float) -> float:
        return seconds + self.outage_s

    def applied(self, seconds: float) -> Impairment:
        if not self.outage_s:
            return self.impairment
        return replace(self.impairment, outages=((seconds / 2, self.outage_s),))


PROFILES = {
    p.name: p
    for p in (
        Profile("clean", "no impairment"),
        Profile("loss1", "1% random loss", Impairment(loss=0.01)),
        Profile("loss5", "5% random loss", Impairment(loss=0.05)),
        Profile(
            "burst2", "2% burst loss (Gilbert-Elliott, bursts of 5)", Impairment(burst=GilbertElliott.for_rate(0.02, 5))
        ),
        Profile("jitter40", "40±20 ms delay (reordering)", Impairment(delay_ms=40.0, jitter_ms=20.0)),
        Profile(
            "cap1.5",
            "1.5 Mbit/s cap, 150 ms queue, then lifted",
            Impairment(rate_bps=CAP_BPS, queue_ms=150.0),
            lift=True,
        ),
        Profile("outage3", "3 s outage", outage_s=3.0),
        Profile("outage40", "40 s outage", outage_s=40.0),
    )
}


@dataclass(frozen=True)
class NetworkBenchConfig:
    profiles: tuple[str, ...] = tuple(PROFILES)
    seconds: float = 10.0  # measured per profile (outage profiles add the outage)
    warmup: float = 2.0  # streamed clean before the impairment starts
    resolution: str = "480p"
    fps: int = 30
    seed: int = 1
    engine: str = "mesh"
    codec: str = "H264"
    clip_frames: int = 60
    in_process: bool = False
    # The client's receivers give up holes and limit keyframe requests as the server's do (app.media.recovery),
    # standing for a browser, which asks for a keyframe soon after loss it cannot repair; aiortc's own otherwise.
    client_recovery: bool = False
    # Also "whep", a viewer of a session's output (app.bench.network_paths), and "rtsp-udp" and "rtsp-tcp", an
    # RTSP-ingest stream whose source's link is impaired (app.bench.network_rtsp).
    paths: tuple[str, ...] = ("session",)


class Measured(Protocol):
    """What the summary reads of a client: the frames it sent (or its source pushed) and got back."""

    @property
    def result(self) -> RoundTrip: ...


@dataclass
class Sample:
    t: float
    client_bytes: int
    server_bytes: int


@dataclass
class Run:
    """What one profile's session saw, on the monotonic clock."""

    start: float = 0.0
    end: float = 0.0
    samples: list[Sample] = field(default_factory=list)
    feedback: Counter[str] = field(default_factory=Counter)
    session_states: list[dict[str, Any]] = field(default_factory=list)
    session_gone_at: float | None = None
    recovery: dict[str, Any] | None = None  # the server's last report of its input's recovery
    return_recovery: dict[str, Any] | None = None  # and of what its return's sender did for the client's losses
    return_rates: list[tuple[float, dict[str, Any]]] = field(default_factory=list)  # (when, the session's)
    lifted_at: float | None = None
    relay: dict[str, dict[str, Any]] | None = None
    failed: str | None = None


async def _sample(client: RelayedClient, relay: UdpRelay, run: Run) -> None:
    while True:
        with contextlib.suppress(Exception):  # a closing connection's stats may fail; the next second retries
            run.samples.append(Sample(time.monotonic(), await client.bytes_sent(), relay.downstream.counters.bytes_in))
        await asyncio.sleep(1.0)


async def _watch_session(http: httpx.AsyncClient, location: str, run: Run) -> None:
    """Poll the session while it exists: its state and close reason, and when it went away."""
    while True:
        with contextlib.suppress(httpx.HTTPError):
            response = await http.get(location)
            if response.status_code == 404:
                run.session_gone_at = time.monotonic()
                return
            if response.status_code == 200:
                body = response.json()
                run.recovery = body.get("recovery")
                run.return_recovery = body.get("return_recovery")
                if body.get("return_rate"):
                    run.return_rates.append((time.monotonic(), body["return_rate"]))
                state = {"state": body.get("state"), "close_reason": body.get("close_reason")}
                if not run.session_states or {k: run.session_states[-1][k] for k in state} != state:
                    run.session_states.append(state | {"at": time.monotonic()})
        await asyncio.sleep(0.5)


CLOSED_METRIC = re.compile(r'^swapcast_sessions_closed_total\{reason="([^"]*)"\}\s+([0-9.eE+]+)$', re.M)


async def closed_reasons(http: httpx.AsyncClient) -> Counter[str]:
    """The server's count of closed sessions by reason (`/metrics`); empty when it cannot be read."""
    with contextlib.suppress(httpx.HTTPError):
        response = await http.get("/metrics")
        if response.status_code == 200:
            return Counter({m[1]: int(float(m[2])) for m in CLOSED_METRIC.finditer(response.text)})
    return Counter()


@contextlib.asynccontextmanager
async def connected(client: RelayedClient, http: httpx.AsyncClient, path: str) -> AsyncIterator[RelayedClient]:
    """`client`'s session, through its relay, while the block runs; then ended and everything closed."""
    await client.relay.start()
    try:
        await client.connect(http, path)
        yield client
    finally:
        if client.location:
            with contextlib.suppress(httpx.HTTPError):
                await http.delete(client.location)
        await client.close()
        client.relay.close()


async def _measure(
    client: RelayedClient, http: httpx.AsyncClient, profile: Profile, config: NetworkBenchConfig, run: Run
) -> None:
    if not await client.wait_frames(1, 30):
        run.failed = "no frame came back within 30 s"
        return
    await asyncio.sleep(config.warmup)
    feedback_before = Counter(client.feedback)
    run.start = time.monotonic()
    client.relay.impair(profile.applied(config.seconds))
    tasks = [asyncio.ensure_future(_sample(client, client.relay, run))]
    if client.location:
        tasks.append(asyncio.ensure_future(_watch_session(http, client.location, run)))
    try:
        run.end = run.start + profile.window_s(config.seconds)
        await asyncio.sleep(run.end - time.monotonic())
        if profile.lift:
            client.relay.impair(CLEAR)
            run.lifted_at = time.monotonic()
            await asyncio.sleep(LIFT_WATCH_S)
        elif profile.outage_s and run.session_gone_at is None:
            back = run.start + config.seconds / 2 + profile.outage_s
            await client.wait_sent_after(back, FRESH_WAIT_S)
        else:
            await client.wait_sent_after(run.end, FRESH_WAIT_S)
        run.feedback = client.feedback - feedback_before
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _client(frames: list[Image], config: NetworkBenchConfig) -> RelayedClient:
    relay = UdpRelay(seed=config.seed)
    return RelayedClient(frames, relay, fps=config.fps, codec=config.codec, recovery=config.client_recovery)


async def _run_profile(
    server: BenchServer, frames: list[Image], profile: Profile, config: NetworkBenchConfig
) -> tuple[RelayedClient, Run]:
    client, run = _client(frames, config), Run()
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        try:
            async with connected(client, http, server.offer_path()):
                await _measure(client, http, profile, config, run)
        except (httpx.HTTPError, OSError, ValueError) as exc:
            run.failed = f"{type(exc).__name__}: {exc}"
    run.relay = client.relay.counters()
    return client, run


async def _slot_came_back(server: BenchServer, frames: list[Image], config: NetworkBenchConfig) -> dict[str, Any]:
    """Whether a new session opens and returns frames (through a clear relay) once the old one has ended."""
    client = _client(frames, config)
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        try:
            async with connected(client, http, server.offer_path()):
                returned = await client.wait_frames(1, SLOT_WAIT_S)
                return {"new_session_opened": True, "new_session_returned_frames": returned}
        except httpx.HTTPStatusError as exc:
            return {"new_session_opened": False, "status": exc.response.status_code, "detail": exc.response.text}


# ------------------------------------------------------------------------------------------------- summary


def freezes(arrivals: Sequence[float], start: float, end: float) -> dict[str, Any]:
    """Gaps longer than `FREEZE_S` between returned frames in [start, end] (its edges count as frames)."""
    times = [start, *sorted(t for t in arrivals if start <= t <= end), end]
    gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b - a > FREEZE_S]
    return {"count": len(gaps), "longest_ms": round(max(gaps) * 1000.0) if gaps else 0}


def kbps_series(samples: Sequence[Sample], start: float) -> list[dict[str, float]]:
    """Each sender's rate between consecutive samples, at the later sample's time since `start`."""
    out = []
    for a, b in zip(samples, samples[1:], strict=False):
        span = b.t - a.t
        if span <= 0:
            continue
        out.append(
            {
                "t": round(b.t - start, 1),
                "client_kbps": round((b.client_bytes - a.client_bytes) * 8 / span / 1000.0),
                "server_kbps": round((b.server_bytes - a.server_bytes) * 8 / span / 1000.0),
            }
        )
    return out


def settled_after(series: Sequence[dict[str, float]], key: str, limit_kbps: float, until: float) -> float | None:
    """The time from which every sample up to `until` stays at or under `limit_kbps`; None if none does."""
    inside = [s for s in series if s["t"] <= until]
    for i, sample in enumerate(inside):
        if all(s[key] <= limit_kbps for s in inside[i:]):
            return max(0.0, sample["t"] - 1.0)  # the sample covers the second before it
    return None


def return_rate_series(samples: Sequence[tuple[float, dict[str, Any]]], start: float) -> list[dict[str, Any]]:
    """What the server's return encoder aimed at (its session's `return_rate`), at each poll since `start`: the
    target, and with loss control the reason and the last fraction lost."""
    return [
        {
            "t": round(at - start, 1),
            "target_kbps": round(rate["target_bps"] / 1000.0),
            "reason": rate.get("reason"),
            "fraction_lost": rate.get("fraction_lost"),
        }
        for at, rate in samples
    ]


def _per_second(client: Measured, start: float, seconds: int) -> list[tuple[int, list[float]]]:
    """(frames returned, their latencies in ms) in each second from `start`."""
    bins: list[tuple[int, list[float]]] = []
    received = client.result.received
    sent_at = client.result.sent_at
    for i in range(seconds):
        lo, hi = start + i, start + i + 1
        inside = [r for r in received if lo <= r.at < hi]
        bins.append((len(inside), [(r.at - sent_at[r.frame_id]) * 1000.0 for r in inside if r.frame_id in sent_at]))
    return bins


def recovered_after(client: Measured, lifted_at: float, clean: dict[str, Any] | None, fps: int) -> float | None:
    """Seconds after the cap lifted until a second returned `RECOVERED_FPS` of the clean fps with its median
    latency under 1.5x the clean p95 (the configured fps and 400 ms without a clean run)."""
    target_fps = RECOVERED_FPS * (clean["fps"] if clean else fps)
    clean_p95 = clean["latency_ms"]["p95"] if clean and clean["latency_ms"]["p95"] else None
    limit_ms = 1.5 * clean_p95 if clean_p95 else 400.0
    for i, (count, latencies) in enumerate(_per_second(client, lifted_at, int(LIFT_WATCH_S))):
        if count >= target_fps and latencies and float(np.median(latencies)) <= limit_ms:
            return float(i + 1)
    return None


def summarize(
    profile: Profile, client: Measured, run: Run, config: NetworkBenchConfig, clean: dict[str, Any] | None
) -> dict[str, Any]:
    result = client.result
    window = run.end - run.start
    in_window = [r for r in result.received if run.start <= result.sent_at.get(r.frame_id, 0.0) < run.end]
    latencies = [(r.at - result.sent_at[r.frame_id]) * 1000.0 for r in in_window]
    summary: dict[str, Any] = {
        "profile": profile.name,
        "description": profile.description,
        "window_s": round(window, 1),
        "frames_sent": sum(1 for t in result.sent_at.values() if run.start <= t < run.end),
        "frames_returned": len(in_window),
        "fps": round(len(in_window) / window, 1) if window > 0 else 0.0,
        "freezes": freezes([r.at for r in result.received], run.start, run.end),
        "latency_ms": latency_summary(latencies),
        "unreadable": result.unreadable,
        "feedback": {k: run.feedback.get(k, 0) for k in ("pli_sent", "nack_sent", "keyframe_requests_received")},
        "kbps": kbps_series(run.samples, run.start),
        "relay": run.relay,
        "server_recovery": run.recovery,
        "return_recovery": run.return_recovery,
        "return_rate": return_rate_series(run.return_rates, run.start),
        "failed": run.failed,
    }
    series = summary["kbps"]
    in_series = [s for s in series if s["t"] <= window]
    for key in ("client_kbps", "server_kbps"):
        values = [s[key] for s in in_series]
        summary[f"mean_{key}"] = round(float(np.mean(values))) if values else None
    if profile.impairment.rate_bps:
        cap_kbps = profile.impairment.rate_bps / 1000.0
        summary["cap_kbps"] = cap_kbps
        summary["settled_after_s"] = {
            key: settled_after(series, f"{key}_kbps", cap_kbps, window) for key in ("client", "server")
        }
        late = [
            (r.at - result.sent_at[r.frame_id]) * 1000.0
            for r in in_window
            if result.sent_at[r.frame_id] >= run.start + SETTLE_AFTER_S
        ]
        summary["latency_after_5s_ms"] = latency_summary(late)
    if run.lifted_at is not None:
        summary["recovered_after_lift_s"] = recovered_after(client, run.lifted_at, clean, config.fps)
    if profile.outage_s:
        back = run.start + config.seconds / 2 + profile.outage_s
        fresh = [r.at for r in result.received if result.sent_at.get(r.frame_id, 0.0) >= back]
        any_after = [r.at for r in result.received if r.at >= back]
        summary["outage"] = {
            "seconds": profile.outage_s,
            "fresh_frame_after_s": round(min(fresh) - back, 2) if fresh else None,
            "first_frame_after_s": round(min(any_after) - back, 2) if any_after else None,
            "session_states": [
                {k: v for k, v in s.items() if k != "at"} | {"at_s": round(s["at"] - run.start, 1)}
                for s in run.session_states
            ],
            "session_gone_after_s": (
                round(run.session_gone_at - run.start, 1) if run.session_gone_at is not None else None
            ),
        }
    if clean is not None and profile.name != "clean":
        summary["vs_clean"] = vs_clean(summary, clean)
    return summary


def vs_clean(summary: dict[str, Any], clean: dict[str, Any]) -> dict[str, float | None]:
    def ratio(ours: float | None, theirs: float | None) -> float | None:
        return round(ours / theirs, 2) if ours is not None and theirs else None

    return {
        "fps_ratio": ratio(summary["fps"], clean["fps"]),
        "latency_p50_ratio": ratio(summary["latency_ms"]["p50"], clean["latency_ms"]["p50"]),
        "latency_p95_ratio": ratio(summary["latency_ms"]["p95"], clean["latency_ms"]["p95"]),
    }


# ------------------------------------------------------------------------------------------------- run


async def run_rtc_paths(
    server: BenchServer, frames: list[Image], config: NetworkBenchConfig, progress: bool
) -> list[dict[str, Any]]:
    """The session profiles, then the WHEP viewer's, each a row."""
    rows: list[dict[str, Any]] = []
    clean: dict[str, Any] | None = None
    for name in config.profiles if "session" in config.paths else ():
        profile = PROFILES[name]
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            closed_before = await closed_reasons(http)
            client, run = await _run_profile(server, frames, profile, config)
            summary = summarize(profile, client, run, config, clean)
            if profile.outage_s and run.session_gone_at is not None:
                await asyncio.sleep(1.0)  # the close is counted once the session has released its slot
                summary["outage"]["closed_by_server"] = dict(await closed_reasons(http) - closed_before)
                summary["outage"]["slot"] = await _slot_came_back(server, frames, config)
        if name == "clean":
            clean = summary
        rows.append(summary)
        if progress:
            print_progress(
                f"{name:>9}",
                summary["latency_ms"],
                f"{summary['fps']} fps, freezes {summary['freezes']['count']} "
                f"(longest {summary['freezes']['longest_ms']} ms)",
                run.failed,
            )
        await asyncio.sleep(0.5)
    if "whep" in config.paths:
        rows.extend(await _run_whep(server, frames, config, progress))
    return rows


async def run_whep_profile(
    server: BenchServer, frames: list[Image], profile: Profile, config: NetworkBenchConfig
) -> tuple[RelayedClient, Run]:
    """One session streaming through a clear relay, and its WHEP viewer through `profile`'s relay."""
    session, run = _client(frames, config), Run()
    viewer = RelayedViewer(
        session, UdpRelay(seed=config.seed), frames[:1], fps=config.fps, recovery=config.client_recovery
    )
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        try:
            async with connected(session, http, server.offer_path()):
                if not await session.wait_frames(1, 30):
                    run.failed = "the session returned no frame within 30 s"
                    return viewer, run
                assert session.location is not None
                async with connected(viewer, http, f"{session.location}/whep"):
                    await _measure(viewer, http, profile, config, run)
                    run.recovery = await viewer_stats(http, f"{session.location}/whep")
        except (httpx.HTTPError, OSError, ValueError) as exc:
            run.failed = f"{type(exc).__name__}: {exc}"
    run.relay = viewer.relay.counters()
    return viewer, run


async def _run_whep(
    server: BenchServer, frames: list[Image], config: NetworkBenchConfig, progress: bool
) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    clean: dict[str, Any] | None = None
    for name in whep_profiles(config.profiles):
        profile = PROFILES[name]
        viewer, run = await run_whep_profile(server, frames, profile, config)
        summary = summarize(profile, viewer, run, config, clean)
        if name == "clean":
            clean = summary
        rows.append(path_summary(summary, "whep"))
        if progress:
            print_progress(f"whep/{name:>9}", summary["latency_ms"], f"{summary['fps']} fps", run.failed)
        await asyncio.sleep(0.5)
    return rows


AIORTC_LIMITS = (
    "receiver: NACK for every gap in sequence numbers (no delay, no retry limit); the sender retransmits from a "
    "128-packet history, over RTX when negotiated (the server's session sender: from its own 1024-packet history, "
    "and it makes the receiver ask again while it reports loss: SWAPCAST_ENCODER_RETURN_RECOVERY)",
    "receiver: PLI when the jitter buffer drops an incomplete frame or the decoder fails; never FIR",
    "sender: a new keyframe on PLI or FIR",
    "congestion feedback: REMB only (goog-remb, from abs-send-time); no transport-cc, no loss-based control: "
    "a sender's rate follows the peer's REMB alone (the server's session sender adds loss-based control on the "
    "client's receiver reports: SWAPCAST_ENCODER_LOSS_CONTROL)",
)
