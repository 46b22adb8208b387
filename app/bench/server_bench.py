"""`swapcast bench-server`: what our server adds to a WebRTC round trip, measured against a bare aiortc echo.

For each resolution and number of concurrent sessions, real aiortc clients send a real face clip with frame ids
stamped in pixels and read the ids back from what returns. The same clients run against

- a bare aiortc echo server (the received track relayed back, newest frame only, as `MediaRelay` does),
- our server with the passthrough engine (everything but the model: detect, align, paste, metrics, ...),
- our server with the classic engine,
- our server with the mesh engine (the default users get: no swap weights, the face mesh landmark model),

each in its own process on 127.0.0.1 (or, with `in_process`, in threads of the benchmark's process), in the same
run. The clients encode in real time, as a browser's WebRTC encoder does (`client_encoder`). Reported per
cell: round-trip latency p50/p95/p99 over every returned frame sent inside the measuring window, frames per
second returned per session, and frames the server dropped; and per server, the difference to the echo and
the ratio.

With `rtsp_ingest`, each of our servers also gets one RTSP-ingest cell per resolution (`app.bench.rtsp_ingest_cell`):
a stream pulled from a local RTSP source publishing the same clip in real time, timed from source frame to the
stream's RTSP output, and compared with the one-session cell of the same server and resolution.
"""

import asyncio
import contextlib
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import numpy as np
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.contrib.media import MediaRelay
from aiortc.mediastreams import MediaStreamTrack
from fastapi import FastAPI, Request, Response

from app.bench.rtc_client import RtcClient
from app.bench.rtsp_ingest_cell import CellCounts, RtspCell, compare_to_sessions, latency_summary, run_rtsp_cell
from app.pipeline.types import Image
from app.processes import wait_or_kill

ECHO = "echo"
LATE_FRAMES_S = 10.0
RESOLUTIONS = {"480p": (640, 480), "720p": (1280, 720)}


@dataclass(frozen=True)
class ServerBenchConfig:
    seconds: float = 3.0  # measured per cell
    warmup: float = 1.5  # streamed before measuring
    sessions: tuple[int, ...] = (1, 2, 4)
    resolutions: tuple[str, ...] = ("480p", "720p")
    engines: tuple[str, ...] = ("passthrough", "classic", "mesh")
    echo: bool = True
    codec: str = "H264"
    fps: int = 30
    clip_frames: int = 60
    face_lost: bool = True  # also count frames revealing the real face (app.bench.face_lost)
    # "aiortc": the echo re-encodes as bare aiortc does (libx264 medium); "live": with swapcast's encoder, so
    # the difference to the echo is the server alone.
    echo_encoder: str = "aiortc"
    # How the clients encode what they send. "live": a real-time H.264 encoder (swapcast's: x264 superfast,
    # zerolatency), as a browser's WebRTC encoder is; "aiortc": aiortc's default (libx264 medium), which on two
    # cores could not send 720p at 30 fps (22 fps came back from the bare echo), so it measured the client.
    client_encoder: str = "live"
    # The servers in this process (threads) rather than each in its own: the old way, kept for comparison;
    # the process's CPU time then includes the clients', so `server_cpu_ms_per_frame` is left out.
    in_process: bool = False
    # One RTSP-ingest stream per our server and resolution, beside its session cells (app.bench.rtsp_ingest_cell).
    rtsp_ingest: bool = True


@dataclass
class Cell(CellCounts):
    sessions: int
    fps: list[float] = field(default_factory=list)
    server_latency_p50_ms: list[float] = field(default_factory=list)
    server_hops_ms: list[dict[str, dict[str, float]]] = field(default_factory=list)
    detections: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "resolution": self.resolution,
            "sessions": self.sessions,
            "latency_ms": latency_summary(self.latencies_ms),
            "fps_per_session": round(float(np.mean(self.fps)), 1) if self.fps else 0.0,
            "frames_sent": self.sent,
            "frames_returned": self.returned,
            "unreadable": self.unreadable,
            "server_dropped": self.server_dropped,
            # Our server's own share: decoded input frame -> swapped frame handed to the encoder (its stats).
            "server_latency_p50_ms": (
                round(float(np.mean(self.server_latency_p50_ms)), 1) if self.server_latency_p50_ms else None
            ),
            # Where the server's time went, hop by hop (app.live.hops), averaged over the sessions.
            "server_hops_ms": _mean_hops(self.server_hops_ms),
            # The server process's CPU time (all its threads) per frame returned in the window: what each frame
            # costs, much less sensitive to other load on the machine than its latency.
            "server_cpu_ms_per_frame": self.server_cpu_ms_per_frame,
            # Frames that waited for a detection by reason, and background detections, summed over sessions.
            "detections": dict(self.detections) or None,
            "failed": self.failed,
        }


def _mean_hops(per_session: list[dict[str, dict[str, float]]]) -> dict[str, dict[str, float]]:
    hops: dict[str, dict[str, float]] = {}
    for name in dict.fromkeys(hop for session in per_session for hop in session):
        values = [session[name] for session in per_session if name in session]
        hops[name] = {q: round(float(np.mean([v[q] for v in values])), 1) for q in ("p50", "p95")}
    return hops


# ------------------------------------------------------------------------------------------------- servers


def _echo_app() -> FastAPI:
    app = FastAPI()
    relay = MediaRelay()
    peers: set[RTCPeerConnection] = set()

    @app.get("/readyz")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    @app.post("/offer", status_code=201)
    async def offer(request: Request) -> Response:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        peers.add(pc)

        @pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "video":
                pc.addTrack(relay.subscribe(track, buffered=False))

        @pc.on("connectionstatechange")
        async def on_state() -> None:
            if pc.connectionState in ("failed", "closed"):
                peers.discard(pc)
                await pc.close()

        await pc.setRemoteDescription(RTCSessionDescription(sdp=(await request.body()).decode(), type="offer"))
        await pc.setLocalDescription(await pc.createAnswer())
        return Response(pc.localDescription.sdp, status_code=201, media_type="application/sdp")

    return app


def _app(kind: str, identity_dir: str, echo_encoder: str, rtsp: bool = False) -> FastAPI:
    """The echo or one of our servers, as `kind` says; with `rtsp`, ours serve RTSP on a free port and may pull
    sources on 127.0.0.1 (the benchmark's own RTSP source)."""
    if kind == ECHO:
        if echo_encoder == "live":
            # The echo re-encodes with swapcast's encoder too: the difference is then the server alone.
            from app.media.encoder import install_timed_encoders

            install_timed_encoders()
        app = _echo_app()
    else:
        from app.auth.settings import AccessSettings
        from app.server.app import create_app
        from app.server.settings import ServerSettings
        from app.settings import PipelineSettings

        settings = ServerSettings(
            identity_dir=Path(identity_dir),
            rtsp_enabled=rtsp,
            rtsp_port=0,
            ingest_allowed_networks=["127.0.0.1/32"] if rtsp else [],
            max_sessions=16,
            pipeline=PipelineSettings(engine=kind),
            # The benchmark's own loopback server runs in local mode, whatever keys the user has made.
            access=AccessSettings(keys_file=Path(identity_dir) / "no-keys.json"),
        )
        app = create_app(settings)
    return app


def _serve(kind: str, identity_dir: str, echo_encoder: str = "aiortc", rtsp: bool = False) -> None:
    """Child process: one server on a free 127.0.0.1 port, printed as the first line of stdout."""
    import logging

    import uvicorn

    from app.media.peer import use_host_addresses

    logging.basicConfig(level=logging.ERROR)
    use_host_addresses(["127.0.0.1"])
    app = _app(kind, identity_dir, echo_encoder, rtsp)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(sock.getsockname()[1], flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="error")).run(sockets=[sock])


def _became_ready(base_url: str, alive: Callable[[], bool], within_s: float = 120.0) -> bool:
    """Whether the server at `base_url` answered `/readyz` with 200 before it died or the time ran out."""
    deadline = time.monotonic() + within_s
    while alive() and time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base_url}/readyz", timeout=5).status_code == 200:
                return True
        time.sleep(0.2)
    return False


class ServerProcess:
    def __init__(
        self,
        kind: str,
        identity_dir: Path,
        echo_encoder: str = "aiortc",
        rtsp: bool = False,
        log: IO[str] | None = None,
    ) -> None:
        """`log`: where the server's log (its stderr) goes; this process's stderr by default."""
        self.kind = kind
        argv = [kind, str(identity_dir), echo_encoder] + (["rtsp"] if rtsp else [])
        self.process = subprocess.Popen(
            [sys.executable, "-m", "app.bench.server_bench", *argv],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert self.process.stdout is not None
        port = self.process.stdout.readline().strip()
        if not port.isdigit():
            self.stop()
            raise RuntimeError(f"{kind} server did not start")
        self.base_url = f"http://127.0.0.1:{port}"
        if not _became_ready(self.base_url, lambda: self.process.poll() is None):
            self.stop()
            raise RuntimeError(f"{kind} server did not become ready")
        self.identity: str | None = None

    def cpu_seconds(self) -> float | None:
        """User and system CPU time the server process has used so far (Linux; None elsewhere)."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        # Fields 14 and 15 of proc(5) (utime, stime), counted after the ")" that ends the command name.
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def offer_path(self) -> str:
        return "/offer" if self.kind == ECHO else f"/v1/sessions?identity={self.identity}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            wait_or_kill(self.process, 15)


class ThreadServer:
    """The same server run by a thread of this process (`ServerBenchConfig.in_process`)."""

    def __init__(self, kind: str, identity_dir: Path, echo_encoder: str = "aiortc", rtsp: bool = False) -> None:
        import uvicorn

        from app.media.peer import use_host_addresses

        self.kind = kind
        use_host_addresses(["127.0.0.1"])
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.base_url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        app = _app(kind, str(identity_dir), echo_encoder, rtsp)
        self._server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True)
        self._thread.start()
        if not _became_ready(self.base_url, self._thread.is_alive):
            self.stop()
            raise RuntimeError(f"{kind} server did not become ready")
        self.identity: str | None = None

    def cpu_seconds(self) -> float | None:
        return None  # the process's time includes the clients'

    def offer_path(self) -> str:
        return "/offer" if self.kind == ECHO else f"/v1/sessions?identity={self.identity}"

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(30)
        self._sock.close()


BenchServer = ServerProcess | ThreadServer


# ------------------------------------------------------------------------------------------------- clients


async def _run_cell(server: BenchServer, frames: list[Image], cell: Cell, config: ServerBenchConfig) -> None:
    clients = [RtcClient(frames, fps=config.fps, codec=config.codec) for _ in range(cell.sessions)]
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        try:
            await asyncio.gather(*(c.connect(http, server.offer_path()) for c in clients))
            if not all(await asyncio.gather(*(c.wait_frames(1, 30) for c in clients))):
                cell.failed = "no frame came back within 30 s"
                return
            start = time.monotonic() + config.warmup
            end = start + config.seconds
            await asyncio.sleep(start - time.monotonic())
            cpu_before = server.cpu_seconds()
            await asyncio.sleep(end - time.monotonic())
            cpu_after = server.cpu_seconds()
            # Frames come back in order: once a client got one sent after the window, none of the window's
            # frames is still on its way (those never coming were dropped).
            await asyncio.gather(*(c.wait_sent_after(end, LATE_FRAMES_S) for c in clients))
            for client in clients:
                result = client.result
                in_window = [r for r in result.received if start <= result.sent_at.get(r.frame_id, 0.0) < end]
                cell.latencies_ms.extend((r.at - result.sent_at[r.frame_id]) * 1000.0 for r in in_window)
                cell.fps.append(len(in_window) / config.seconds)
                cell.sent += sum(1 for t in result.sent_at.values() if start <= t < end)
                cell.returned += len(in_window)
                cell.unreadable += result.unreadable
            if cpu_before is not None and cpu_after is not None and cell.returned:
                cell.server_cpu_ms_per_frame = round((cpu_after - cpu_before) * 1000.0 / cell.returned, 1)
            if server.kind != ECHO:
                dropped = 0
                for client in clients:
                    stats = (await http.get(client.location or "")).json()
                    dropped += int(stats.get("dropped", 0))
                    if stats.get("latency_ms", {}).get("p50") is not None:
                        cell.server_latency_p50_ms.append(float(stats["latency_ms"]["p50"]))
                    if stats.get("hops_ms"):
                        cell.server_hops_ms.append(stats["hops_ms"])
                    cell.detections.update(stats.get("detections") or {})
                cell.server_dropped = dropped
        except (httpx.HTTPError, OSError, ValueError) as exc:
            cell.failed = f"{type(exc).__name__}: {exc}"
        finally:
            for client in clients:
                if client.location and server.kind != ECHO:
                    with contextlib.suppress(httpx.HTTPError):
                        await http.delete(client.location)
            await asyncio.gather(*(c.close() for c in clients), return_exceptions=True)
    await asyncio.sleep(0.5)  # let the server finish tearing down before the next cell


def engine_unavailable(kind: str) -> str | None:
    """Why a server with engine `kind` cannot start here (its models are not in the store), or None."""
    if kind != "mesh":
        return None  # passthrough and classic need only the detector, which the store builds itself
    from app.model_store import mesh_available, open_model_store
    from app.settings import PipelineSettings

    settings = PipelineSettings(engine="mesh")
    if mesh_available(settings, open_model_store()):
        return None
    return f"the mesh engine needs its landmark model: run `swapcast models import {settings.landmark_model}`"


def bench_clip(resolution: str, count: int) -> list[Image]:
    from app.media.clips import load_sample, make_motion_clip

    astronaut = load_sample("astronaut")
    size = RESOLUTIONS[resolution]
    # The astronaut's face centre in the 512x512 still.
    return make_motion_clip(astronaut, size=size, frames=count, focus=(225.0, 118.0), seed=3).frames


def upload_identity(server: BenchServer) -> None:
    import cv2

    from app.media.clips import load_sample

    ok, png = cv2.imencode(".png", load_sample("tom_hanks"))
    if not ok:
        raise RuntimeError("cannot encode the identity photo")
    response = httpx.post(
        f"{server.base_url}/v1/identities",
        files={"image": ("tom.png", png.tobytes())},
        data={"consent": "self"},  # the photo is a public sample the benchmark stands in for
        headers={"X-Swapcast": "1"},  # a form POST without it is refused as possibly cross-site
        timeout=60,
    )
    response.raise_for_status()
    server.identity = response.json()["id"]


def compare(cells: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each server's cell against the echo server's cell of the same resolution and session count."""
    echo = {(c["resolution"], c["sessions"]): c for c in cells if c["server"] == ECHO}
    out = []
    for cell in cells:
        base = echo.get((cell["resolution"], cell["sessions"]))
        if cell["server"] == ECHO or base is None:
            continue
        row: dict[str, Any] = {"server": cell["server"], "resolution": cell["resolution"], "sessions": cell["sessions"]}
        for q in ("p50", "p95"):
            ours, theirs = cell["latency_ms"][q], base["latency_ms"][q]
            row[f"added_{q}_ms"] = round(ours - theirs, 1) if ours is not None and theirs is not None else None
            row[f"ratio_{q}"] = round(ours / theirs, 2) if ours is not None and theirs else None
        row["fps_ratio"] = (
            round(cell["fps_per_session"] / base["fps_per_session"], 2) if base["fps_per_session"] else None
        )
        out.append(row)
    return out


def _rtsp_cell(
    server: BenchServer, frames: list[Image], kind: str, resolution: str, config: ServerBenchConfig, progress: bool
) -> dict[str, Any]:
    cell = RtspCell(kind, resolution)
    run_rtsp_cell(
        server.base_url,
        server.identity or "",
        frames,
        cell,
        fps=config.fps,
        warmup=config.warmup,
        seconds=config.seconds,
        cpu_seconds=server.cpu_seconds,
    )
    summary = cell.summary()
    if progress:
        print_progress(
            f"{kind:>11} {resolution} rtsp ingest", summary["latency_ms"], f"{summary['fps']} fps", cell.failed
        )
    return summary


def print_progress(label: str, latency: dict[str, Any], rest: str, failed: str | None) -> None:
    """One line of a benchmark's progress: what was measured, its latency, the rest, and why it failed."""
    print(
        f"{label}: p50 {latency['p50']} ms, p95 {latency['p95']} ms, {rest}" + (f" FAILED {failed}" if failed else ""),
        flush=True,
    )


def machine_report(load_before_1m: float) -> dict[str, Any]:
    """The machine a WebRTC benchmark ran on, and its load before and after."""
    import aiortc

    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "aiortc": aiortc.__version__,
        # Everything (clients, servers, codecs) shares these cores: other load skews every cell.
        "load_average_1m": {"before": round(load_before_1m, 2), "after": round(os.getloadavg()[0], 2)},
    }


def run_server_bench(config: ServerBenchConfig, progress: bool = True) -> dict[str, Any]:
    servers = ([ECHO] if config.echo else []) + list(config.engines)
    clips = {r: bench_clip(r, config.clip_frames) for r in config.resolutions}
    cells: list[dict[str, Any]] = []
    rtsp_cells: list[dict[str, Any]] = []
    started = time.perf_counter()
    load_before = os.getloadavg()
    if config.client_encoder == "live":
        from app.media.encoder import install_timed_encoders

        install_timed_encoders()  # this process's senders, i.e. the clients (servers run their own)
    with tempfile.TemporaryDirectory(prefix="swapcast-bench-") as tmp:
        for kind in servers:
            reason = engine_unavailable(kind)
            if reason is not None:
                for resolution in config.resolutions:
                    for sessions in config.sessions:
                        cell = Cell(kind, resolution, sessions, failed=reason)
                        cells.append(cell.summary())
                    if config.rtsp_ingest:
                        rtsp_cells.append(RtspCell(kind, resolution, failed=reason).summary())
                if progress:
                    print(f"{kind:>11} skipped: {reason}", flush=True)
                continue
            server: BenchServer = (ThreadServer if config.in_process else ServerProcess)(
                kind, Path(tmp) / kind, config.echo_encoder, rtsp=config.rtsp_ingest and kind != ECHO
            )
            try:
                if kind != ECHO:
                    upload_identity(server)
                for resolution in config.resolutions:
                    for sessions in config.sessions:
                        cell = Cell(kind, resolution, sessions)
                        asyncio.run(_run_cell(server, clips[resolution], cell, config))
                        summary = cell.summary()
                        cells.append(summary)
                        if progress:
                            print_progress(
                                f"{kind:>11} {resolution} x{sessions}",
                                summary["latency_ms"],
                                f"{summary['fps_per_session']} fps/session",
                                cell.failed,
                            )
                    if config.rtsp_ingest and kind != ECHO:
                        rtsp_cells.append(_rtsp_cell(server, clips[resolution], kind, resolution, config, progress))
            finally:
                server.stop()
    face_lost: dict[str, Any] | None = None
    if config.face_lost:
        from app.bench.face_lost import run_face_lost_bench

        face_lost = run_face_lost_bench()
        if progress:
            for row in face_lost["rows"]:
                print(
                    f"face lost: {row['policy']:>5} every {row['detect_interval']}: {row['revealed_frames']} of "
                    f"{row['frames_showing_a_face']} frames reveal the real face",
                    flush=True,
                )
    return {
        "config": {
            "seconds": config.seconds,
            "warmup": config.warmup,
            "sessions": list(config.sessions),
            "resolutions": {r: list(RESOLUTIONS[r]) for r in config.resolutions},
            "codec": config.codec,
            "fps": config.fps,
            "echo_encoder": config.echo_encoder,
            "client_encoder": config.client_encoder,
            "in_process": config.in_process,
            "rtsp_ingest": config.rtsp_ingest,
        },
        "machine": machine_report(load_before[0]),
        "cells": cells,
        "compared_to_echo": compare(cells),
        # One stream per our server and resolution: local RTSP source -> POST /v1/streams -> the stream's RTSP
        # output, timed from source frame to decoded output frame; and against the one-session cell beside it.
        "rtsp_ingest": rtsp_cells,
        "rtsp_ingest_vs_session": compare_to_sessions(cells, rtsp_cells),
        # Frames where the real face shows unswapped, per SWAPCAST_ON_FACE_LOST policy (app.bench.face_lost).
        "face_lost": face_lost,
        "seconds": round(time.perf_counter() - started, 1),
    }


# A benchmark server: python -m app.bench.server_bench KIND IDENTITY_DIR [ECHO_ENCODER [rtsp]]
if __name__ == "__main__":
    _serve(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "aiortc", sys.argv[4:5] == ["rtsp"])
