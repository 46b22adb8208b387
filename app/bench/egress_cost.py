"""`swapcast bench egress`: what a channel's outputs cost the server, measured from outside.

A `swapcast serve` process (its own, as users run it, RTSP and SRT on, pushes allowed to loopback) gets one
WebRTC publisher into a channel: 640x480 at 25 fps of a moving clip of a real face, sent from this process.
Three cells per engine:

- `none`: the publisher alone (the session's swap and its return to the publisher);
- `readers`: the same plus an RTSP consumer (FFmpeg over TCP), an SRT caller (FFmpeg) and two RTMP pushes to a
  local nginx: what the channel's egress costs beside the swap (`readers_over_none`);
- `viewer`: `readers` and a WHEP viewer (aiortc), whose sender packetises and encrypts every packet in Python:
  the cell that counts the encodes a published frame meets with every kind of reader attached.

Every client is a process of its own, never a child of the server; the FFmpeg readers copy the stream to nothing
(a player's decoding is its own cost, and on a small machine it would only take CPU from the server measured).

Over `seconds` after `warmup_s` the server's CPU is read from /proc: the serve process and all its descendants
(`app.bench.proc_cpu`), as cores (CPU seconds / wall seconds). With `baseline`, a checkout of that commit
(`git archive`, so the repository is left untouched) is served by the same Python beside ours, and the cells of
the two alternate in every round, so that a noisy machine weighs on both alike.

What the server says it encoded comes from its own figures, read before and after the window: the channel
(`GET /v1/channels/NAME`, and its WHEP listing), the session (`GET /v1/sessions/ID`, and its WHEP listing), the
pushes and `/metrics`. Every counter of frames found there is kept (missing ones are null, so older servers
report too); `encodes_per_frame` divides each encoder's frames over the window by the frames published.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from app.bench.egress_clients import Client, NginxRtmp, ffmpeg_reader, free_port, readers_unavailable, whep_viewer
from app.bench.egress_counters import OUTPUTS, encodes_per_frame, flatten_counters, per_frame, window_deltas
from app.bench.proc_cpu import tree_cpu_seconds
from app.processes import wait_or_kill

REPO = Path(__file__).resolve().parents[2]
CHANNEL = "egress"
CELLS = ("none", "readers", "viewer")
CURRENT = "current"


@dataclass(frozen=True)
class EgressConfig:
    seconds: float = 20.0
    warmup_s: float = 8.0
    rounds: int = 2
    engines: tuple[str, ...] = ("passthrough", "mesh")
    baseline: str | None = None  # a commit (or any ref) to measure beside the working tree
    fps: int = 25
    size: tuple[int, int] = (640, 480)
    pushes: int = 2
    clip_frames: int = 100
    ready_timeout_s: float = 300.0
    connect_timeout_s: float = 45.0  # for the readers and pushes to be counted, before the warm-up


# ------------------------------------------------------------------------------------------------- servers


@contextlib.contextmanager
def checkout(ref: str, into: Path) -> Iterator[tuple[Path, str]]:
    """The tree of commit `ref` in a folder under `into` (and its full id); the folder goes at the end."""
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", f"{ref}^{{commit}}"], capture_output=True)
    if found.returncode != 0:
        raise RuntimeError(f"--baseline {ref}: not a commit of {REPO}")
    commit = found.stdout.decode().strip()
    root = Path(tempfile.mkdtemp(prefix=f"swapcast-{commit[:8]}-", dir=into))
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", commit], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(root)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {commit} failed")
    try:
        yield root, commit
    finally:
        subprocess.run(["rm", "-rf", str(root)], check=False)


def head_commit() -> str:
    found = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain"], capture_output=True, text=True).stdout
    return found.stdout.strip() + ("+changes" if dirty.strip() else "")


class Server:
    """`python -m app.cli serve` of the tree at `root`, with this interpreter, on free loopback ports."""

    def __init__(self, label: str, root: Path, engine: str, work: Path, ready_timeout_s: float) -> None:
        self.label = label
        self.port, self.rtsp_port, self.srt_port = free_port(), free_port(), free_port(2)  # SOCK_DGRAM
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.identity = ""
        state = work / f"{label}-{engine}"
        state.mkdir(parents=True)
        self.log = state / "server.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWAPCAST_")} | {
            "PYTHONPATH": str(root),
            "SWAPCAST_HOST": "127.0.0.1",
            "SWAPCAST_PORT": str(self.port),
            "SWAPCAST_RTSP_PORT": str(self.rtsp_port),
            "SWAPCAST_SRT_PORT": str(self.srt_port),
            "SWAPCAST_ENGINE": engine,
            "SWAPCAST_KEYS_FILE": str(state / "keys.json"),  # none: local mode, no credentials
            "SWAPCAST_IDENTITY_DIR": str(state / "identities"),
            "SWAPCAST_CHANNEL_DIR": str(state / "channels"),
            "SWAPCAST_ICE_HOST_ADDRESSES": '["127.0.0.1"]',
            "SWAPCAST_DESTINATION_ALLOWED_NETWORKS": '["127.0.0.0/8"]',  # the pushes' nginx (older servers: no rule)
        }
        for name in ("SWAPCAST_MODEL_DIR",):  # where the models are stays as this process has it
            if name in os.environ:
                env[name] = os.environ[name]
        with self.log.open("w") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "serve"], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + ready_timeout_s
        while not self._ready():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the {label} server did not become ready: {self.tail()}")
            time.sleep(0.5)

    def _ready(self) -> bool:
        try:
            return httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.process.pid)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-600:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        wait_or_kill(self.process, 20)


async def prepare(server: Server, photo: bytes, config: EgressConfig) -> None:
    """The identity the publisher wears and the channel it publishes into."""
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        uploaded = await http.post(
            "/v1/identities",
            files={"image": ("face.png", photo)},
            data={"consent": "self"},  # a public sample photo
            headers={"X-Swapcast": "1"},
        )
        uploaded.raise_for_status()
        server.identity = str(uploaded.json()["id"])
        width, height = config.size
        made = await http.post("/v1/channels", json={"name": CHANNEL, "width": width, "height": height, "fps": 25})
        made.raise_for_status()


# ------------------------------------------------------------------------------------------------- one cell


async def _json(http: httpx.AsyncClient, path: str) -> Any:
    try:
        response = await http.get(path)
    except httpx.HTTPError:
        return None
    return response.json() if response.status_code == 200 else None


async def snapshot(http: httpx.AsyncClient, session: str | None) -> dict[str, Any]:
    """Every figure the server gives about the channel, the session and the pushes, and its metrics."""
    parts = {
        "channel": f"/v1/channels/{CHANNEL}",
        "channel_whep": f"/v1/channels/{CHANNEL}/whep",
        "pushes": f"/v1/channels/{CHANNEL}/pushes",
    }
    if session:
        parts |= {"session": session, "session_whep": f"{session}/whep"}
    found = {name: await _json(http, path) for name, path in parts.items()}
    try:
        found["metrics"] = (await http.get("/metrics")).text
    except httpx.HTTPError:
        found["metrics"] = ""
    return found


async def _add_push(http: httpx.AsyncClient, url: str) -> str:
    added = await http.post(f"/v1/channels/{CHANNEL}/pushes", json={"url": url})
    if added.status_code != 201:
        raise RuntimeError(f"the server refused a push to {url}: {added.status_code} {added.text[:200]}")
    return str(added.headers.get("location") or f"/v1/channels/{CHANNEL}/pushes/{added.json()['id']}")


async def _start_readers(
    http: httpx.AsyncClient, server: Server, nginx: NginxRtmp, tag: str, work: Path, pushes: int, viewer: bool
) -> tuple[list[Client], list[str]]:
    channel = (await http.get(f"/v1/channels/{CHANNEL}")).json()
    readers = [
        ffmpeg_reader("rtsp", channel["rtsp_url"], work / f"{tag}-rtsp.log"),
        ffmpeg_reader("srt", channel["srt_url"], work / f"{tag}-srt.log"),
    ]
    whep = server.base_url + channel.get("whep_url", f"/v1/channels/{CHANNEL}/whep")
    if channel.get("viewer_token"):
        whep += f"?token={channel['viewer_token']}"
    if viewer:
        readers.append(whep_viewer(whep, work / f"{tag}-whep.log"))
    return readers, [await _add_push(http, nginx.url(f"{tag}-{n}")) for n in range(pushes)]


async def wait_connected(http: httpx.AsyncClient, readers: list[Client], within_s: float) -> dict[str, Any]:
    """Wait until the channel counts each reader (RTSP, SRT, WHEP) and every push is live; what was still
    missing when `within_s` ran out, and how long it took (a reader process still starting is not a cost yet)."""
    started = time.monotonic()
    missing: list[str] = []
    while time.monotonic() - started < within_s:
        channel = await _json(http, f"/v1/channels/{CHANNEL}") or {}
        consumers = channel.get("consumers") or {}
        pushes = (await _json(http, f"/v1/channels/{CHANNEL}/pushes") or {}).get("pushes", [])
        missing = [r.kind for r in readers if r.kind in ("rtsp", "srt", "whep") and not consumers.get(r.kind)]
        missing += [f"push {p.get('id')}: {p.get('state')}" for p in pushes if p.get("state") != "live"]
        if not missing:
            break
        await asyncio.sleep(0.5)
    return {"connected_s": round(time.monotonic() - started, 1), "not_connected": missing}


async def run_cell(
    server: Server, cell: str, frames: list[Any], nginx: NginxRtmp | None, config: EgressConfig, work: Path, tag: str
) -> dict[str, Any]:
    from app.bench.rtc_client import RtcClient

    readers: list[Client] = []
    pushes: list[str] = []
    connected: dict[str, Any] = {}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as http:
        publisher = RtcClient(frames, fps=config.fps, codec="H264")
        try:
            await publisher.connect(http, f"/v1/sessions?identity={server.identity}&channel={CHANNEL}")
            session = publisher.location
            if cell != "none":
                assert nginx is not None
                readers, pushes = await _start_readers(
                    http, server, nginx, tag, work, config.pushes, viewer=cell == "viewer"
                )
                connected = await wait_connected(http, readers, config.connect_timeout_s)
            await asyncio.sleep(config.warmup_s)
            before = await snapshot(http, session)
            cpu0, t0, sent0 = await asyncio.to_thread(server.cpu_seconds), time.monotonic(), publisher.track.sent
            await asyncio.sleep(config.seconds)
            cpu1, t1, sent1 = await asyncio.to_thread(server.cpu_seconds), time.monotonic(), publisher.track.sent
            after = await snapshot(http, session)
            down = [f"{r.kind}: {r.tail()}" for r in readers if not r.alive()]
        finally:
            for location in pushes:
                with contextlib.suppress(httpx.HTTPError):
                    await http.delete(location)
            for reader in readers:
                await asyncio.to_thread(reader.stop)
            if publisher.location:
                with contextlib.suppress(httpx.HTTPError):
                    await http.delete(publisher.location)
            await publisher.close()
    wall = t1 - t0
    deltas = window_deltas(flatten_counters(before), flatten_counters(after))
    published = deltas.get("channel.frames_published", float(sent1 - sent0))  # an older server may not count them
    return {
        "cell": cell,
        "cores": round((cpu1 - cpu0) / wall, 3),
        "cpu_s": round(cpu1 - cpu0, 2),
        "wall_s": round(wall, 2),
        "frames_sent": sent1 - sent0,
        "frames_published": published,
        # Where the machine cannot keep up, fewer frames reach the channel: the cost per frame still compares.
        "cpu_ms_per_frame": round(1000.0 * (cpu1 - cpu0) / published, 2) if published else None,
        "encodes_per_frame": encodes_per_frame(deltas, published),
        "outputs_per_frame": per_frame(deltas, published, OUTPUTS),
        "counters": deltas,
        "pushes": [
            {"state": p.get("state"), "last_error": p.get("last_error")}
            for p in (after.get("pushes") or {}).get("pushes", [])
        ],
        **connected,
        "readers_down": down,
    }


# ------------------------------------------------------------------------------------------------- the run


def _mean(values: list[float]) -> float | None:
    return round(statistics.fmean(values), 3) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def summarise(cells: list[dict[str, Any]], labels: list[str], engines: tuple[str, ...]) -> dict[str, Any]:
    """Per engine and commit: mean cores per cell, readers/none, and the last readers cell's encodes per frame;
    per engine, ours over the baseline's."""
    out: dict[str, Any] = {}
    for engine in engines:
        per: dict[str, Any] = {}
        for label in labels:
            mine = [c for c in cells if c["engine"] == engine and c["commit"] == label]
            cores = {cell: _mean([c["cores"] for c in mine if c["cell"] == cell]) for cell in CELLS}
            last = {cell: next((c for c in reversed(mine) if c["cell"] == cell), None) for cell in CELLS}
            fps = {
                cell: _mean([c["frames_published"] / c["wall_s"] for c in mine if c["cell"] == cell]) for cell in CELLS
            }
            per_frame = {
                cell: _mean([c["cpu_ms_per_frame"] for c in mine if c["cell"] == cell and c["cpu_ms_per_frame"]])
                for cell in CELLS
            }
            per[label] = {
                "cores": cores,
                "published_fps": fps,
                "cpu_ms_per_frame": per_frame,
                "readers_over_none": _ratio(cores["readers"], cores["none"]),
                # The same per published frame: where the machine cannot keep up with every reader, fewer frames
                # are published, and the cores alone understate what the readers cost.
                "readers_over_none_per_frame": _ratio(per_frame["readers"], per_frame["none"]),
                "encodes_per_frame": {cell: (c or {}).get("encodes_per_frame") for cell, c in last.items()},
            }
        if len(labels) == 2:
            new, old = per[labels[0]]["cores"], per[labels[1]]["cores"]
            per["new_over_old"] = {cell: _ratio(new[cell], old[cell]) for cell in CELLS} | {
                f"{cell}_per_frame": _ratio(
                    per[labels[0]]["cpu_ms_per_frame"][cell], per[labels[1]]["cpu_ms_per_frame"][cell]
                )
                for cell in CELLS
            }
        out[engine] = per
    return out


def run_egress_bench(config: EgressConfig, say: Callable[[str], None] | None = None) -> dict[str, Any]:
    from app.bench.server_bench import bench_clip, engine_unavailable

    tell = say or (lambda text: print(text, file=sys.stderr, flush=True))
    for engine in config.engines:
        if (reason := engine_unavailable(engine)) is not None:
            raise RuntimeError(reason)
    if (why := readers_unavailable()) is not None:
        raise RuntimeError(why)
    import cv2

    from app.media.clips import load_sample
    from app.media.encoder import install_timed_encoders
    from app.media.peer import use_host_addresses

    install_timed_encoders()  # the publisher encodes in real time, as a browser does
    use_host_addresses(["127.0.0.1"])
    frames = bench_clip("480p", config.clip_frames)
    ok, png = cv2.imencode(".png", load_sample("tom_hanks"))
    if not ok:
        raise RuntimeError("cannot encode the identity photo")
    started, load_before = time.perf_counter(), os.getloadavg()
    cells: list[dict[str, Any]] = []
    commits = {CURRENT: head_commit()}
    with tempfile.TemporaryDirectory(prefix="swapcast-bench-egress-") as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        roots = {CURRENT: REPO}
        if config.baseline:
            root, commit = stack.enter_context(checkout(config.baseline, work))
            roots[config.baseline] = root
            commits[config.baseline] = commit
        labels = list(roots)
        nginx = NginxRtmp(work / "nginx")
        stack.callback(nginx.stop)
        for engine in config.engines:
            servers: dict[str, Server] = {}
            try:
                for label in labels:
                    tell(f"egress: starting the {label} server ({engine})")
                    servers[label] = Server(label, roots[label], engine, work, config.ready_timeout_s)
                    asyncio.run(prepare(servers[label], png.tobytes(), config))
                for round_index in range(config.rounds):
                    order = labels if round_index % 2 == 0 else labels[::-1]
                    for cell in CELLS:
                        for label in order:
                            tag = f"{label}-{engine}-{cell}-{round_index}".replace("/", "_")
                            tell(f"egress: {engine} {cell} on {label}, round {round_index + 1}")
                            result = asyncio.run(run_cell(servers[label], cell, frames, nginx, config, work, tag))
                            cells.append({"engine": engine, "commit": label, "round": round_index + 1} | result)
                            tell(f"egress:   {result['cores']} cores")
            finally:
                for server in servers.values():
                    server.stop()
    return {
        "config": {
            "seconds": config.seconds,
            "warmup_s": config.warmup_s,
            "rounds": config.rounds,
            "engines": list(config.engines),
            "baseline": config.baseline,
            "size": list(config.size),
            "fps": config.fps,
            "pushes": config.pushes,
        },
        "commits": commits,
        "summary": summarise(cells, labels, config.engines),
        "cells": cells,
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_1m": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        },
        "seconds": round(time.perf_counter() - started, 1),
    }
