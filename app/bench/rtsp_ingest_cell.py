"""The RTSP-ingest cell of `swapcast bench-server`: one stream pulled from a local RTSP source, swapped by the
server under test and played back from its RTSP output, timed from source frame to output frame.

The source is an `RtspServer` of the benchmark's own process publishing the bench clip in real time (a thread
pushes one frame every 1/fps s), each frame stamped with its id as the WebRTC clients stamp theirs
(`app.bench.rtc_client.stamp`). The stream is made with `POST /v1/streams {source_url, identity}`; a PyAV client
(RTSP over TCP, as OBS plays it) reads the ids back from the stream's `rtsp_url`. Latency is the time from a
frame's push into the source to its decoded arrival at that client; fps the distinct frames returned per second
of the measuring window (the output repeats its last frame while the server is behind; repeats are not
counted).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import av
import av.error
import httpx
import numpy as np

from app.bench.rtc_client import ID_MODULO, luma, read_stamp, stamp
from app.media.rtsp_in import RtspTransport, live_options
from app.pipeline.types import Image

SOURCE_PATH = "/bench-source"
FIRST_FRAME_S = 30.0
LATE_FRAMES_S = 10.0
NOT_SHARED = ("total", "detect_background")  # not a stretch of a frame's way through the server


def latency_summary(latencies_ms: list[float]) -> dict[str, Any]:
    """p50/p95/p99 (null without any) and the count, as every cell of the server benchmark reports latency."""
    lat = np.asarray(latencies_ms, dtype=np.float64)
    summary: dict[str, Any] = {
        q: round(float(np.percentile(lat, p)), 1) if lat.size else None
        for q, p in (("p50", 50), ("p95", 95), ("p99", 99))
    }
    return summary | {"n": int(lat.size)}


@dataclass
class CellCounts:
    """What every cell of the server benchmark counts, whether its frames went over WebRTC or RTSP; the counts
    are keyword-only, so each kind of cell names its own fields after `server` and `resolution`."""

    server: str
    resolution: str
    _: KW_ONLY
    latencies_ms: list[float] = field(default_factory=list)
    sent: int = 0
    returned: int = 0
    unreadable: int = 0
    server_dropped: int | None = None
    server_cpu_ms_per_frame: float | None = None
    failed: str | None = None


@dataclass
class RtspCell(CellCounts):
    fps: float = 0.0
    server_latency_p50_ms: float | None = None
    server_hops_ms: dict[str, dict[str, float]] | None = None
    detections: dict[str, int] | None = None

    def summary(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "resolution": self.resolution,
            "streams": 1,
            "latency_ms": latency_summary(self.latencies_ms),
            "fps": round(self.fps, 1),
            "frames_sent": self.sent,
            "frames_returned": self.returned,
            "unreadable": self.unreadable,
            # Frames the stream dropped since it started: all reasons where its stats sum them (`dropped`, as
            # sessions report), else those its ingest worker replaced by a newer one before processing.
            "server_dropped": self.server_dropped,
            # The stream's own figures where its stats carry them as sessions' do (`latency_ms`, `hops_ms`,
            # `detections`), else null.
            "server_latency_p50_ms": self.server_latency_p50_ms,
            "server_hops_ms": self.server_hops_ms,
            "detections": self.detections,
            "server_cpu_ms_per_frame": self.server_cpu_ms_per_frame,
            "failed": self.failed,
        }


class StampedSource:
    """The bench clip published at `fps` on a local RTSP server, each frame stamped with its running id."""

    def __init__(self, frames: list[Image], fps: int) -> None:
        from app.egress.rtsp import RtspServer

        self._frames = frames
        self._fps = fps
        self._server = RtspServer(port=0)
        self._server.start()
        height, width = frames[0].shape[:2]
        self._publisher = self._server.publish(SOURCE_PATH, width, height, fps)
        self.url = self._server.url(SOURCE_PATH)
        self.sent_at: dict[int, float] = {}  # stamp (id mod ID_MODULO) -> when its latest frame was pushed
        self.sent_times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._push, name="bench-rtsp-source", daemon=True)
        self._thread.start()

    def _push(self) -> None:
        next_at = time.monotonic()
        frame_id = 0
        while not self._stop.is_set():
            image = self._frames[frame_id % len(self._frames)].copy()
            stamp(image, frame_id)
            now = time.monotonic()
            self.sent_at[frame_id % ID_MODULO] = now
            self.sent_times.append(now)
            self._publisher.push(image)
            frame_id += 1
            next_at += 1.0 / self._fps
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._publisher.close()
        self._server.stop()


class OutputReader:
    """Plays `url` with PyAV in a thread; for each decoded frame, when it came and when its stamp was pushed."""

    def __init__(self, url: str, sent_at: dict[int, float], transport: RtspTransport = "tcp") -> None:
        self._url = url
        self._transport: RtspTransport = transport
        self._sent_at = sent_at
        self.received: list[tuple[int, float, float]] = []  # stamp, pushed at, decoded at
        self.unreadable = 0
        self.error: str | None = None
        self.first = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, name="bench-rtsp-reader", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            options = live_options(self._transport)
            with av.open(self._url, options=options, timeout=(FIRST_FRAME_S, 5.0)) as container:
                for frame in container.decode(video=0):
                    at = time.monotonic()
                    if self._stop.is_set():
                        return
                    value = read_stamp(luma(frame))
                    pushed = self._sent_at.get(value) if value is not None else None
                    if value is None or pushed is None:
                        self.unreadable += 1
                        continue
                    self.received.append((value, pushed, at))
                    self.first.set()
        except (av.error.FFmpegError, OSError) as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.first.set()

    def got_pushed_after(self, moment: float) -> bool:
        return any(pushed >= moment for _, pushed, _ in self.received[-5:])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _wait(done: Callable[[], bool], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def run_rtsp_cell(
    base_url: str,
    identity: str,
    frames: list[Image],
    cell: RtspCell,
    *,
    fps: int,
    warmup: float,
    seconds: float,
    cpu_seconds: Callable[[], float | None],
) -> None:
    """Measure one stream of the server at `base_url` into `cell` (`cell.failed` says why when it could not)."""
    from app.egress.rtsp import rtsp_unavailable_reason

    reason = rtsp_unavailable_reason()
    if reason is not None:
        cell.failed = f"GStreamer RTSP unavailable: {reason}"
        return
    source = StampedSource(frames, fps)
    reader: OutputReader | None = None
    location: str | None = None
    with httpx.Client(base_url=base_url, timeout=30) as http:
        try:
            created = http.post("/v1/streams", json={"source_url": source.url, "identity": identity})
            if created.status_code != 201:
                cell.failed = f"POST /v1/streams answered {created.status_code}: {created.text[:200]}"
                return
            location = f"/v1/streams/{created.json()['id']}"
            output_url = _wait_for_output(http, location)
            if output_url is None:
                cell.failed = "the stream published no rtsp_url within 30 s"
                return
            reader = OutputReader(output_url, source.sent_at)
            if not reader.first.wait(FIRST_FRAME_S) or not reader.received:
                cell.failed = reader.error or f"no frame came back within {FIRST_FRAME_S:.0f} s"
                return
            start = time.monotonic() + warmup
            end = start + seconds
            time.sleep(max(0.0, start - time.monotonic()))
            cpu_before = cpu_seconds()
            time.sleep(max(0.0, end - time.monotonic()))
            cpu_after = cpu_seconds()
            # The output keeps the source's order: once a frame pushed after the window is back, none of the
            # window's frames is still on its way.
            _wait(lambda: reader is not None and reader.got_pushed_after(end), LATE_FRAMES_S)
            first_arrival: dict[tuple[int, float], float] = {}
            for value, pushed, at in list(reader.received):
                if start <= pushed < end:
                    first_arrival.setdefault((value, pushed), at)
            cell.latencies_ms = [(at - pushed) * 1000.0 for (_, pushed), at in first_arrival.items()]
            cell.returned = len(first_arrival)
            cell.fps = cell.returned / seconds
            cell.sent = sum(1 for t in list(source.sent_times) if start <= t < end)
            cell.unreadable = reader.unreadable
            if cpu_before is not None and cpu_after is not None and cell.returned:
                cell.server_cpu_ms_per_frame = round((cpu_after - cpu_before) * 1000.0 / cell.returned, 1)
            _read_stream_stats(http.get(location).json(), cell)
        except (httpx.HTTPError, OSError, ValueError, KeyError) as exc:
            cell.failed = f"{type(exc).__name__}: {exc}"
        finally:
            if reader is not None:
                reader.close()
            if location is not None:
                with contextlib.suppress(httpx.HTTPError):
                    http.delete(location)
            source.close()
    time.sleep(0.5)  # let the server finish tearing down before the next cell


def _read_stream_stats(stats: dict[str, Any], cell: RtspCell) -> None:
    worker = stats.get("stats") or {}
    dropped = stats.get("dropped", worker.get("dropped"))
    cell.server_dropped = int(dropped) if dropped is not None else None
    p50 = (stats.get("latency_ms") or {}).get("p50")
    cell.server_latency_p50_ms = float(p50) if p50 is not None else None
    cell.server_hops_ms = stats.get("hops_ms") or None
    cell.detections = stats.get("detections") or None


def running_output(stats: dict[str, Any]) -> str | None:
    """The stream's `rtsp_url` once it is running (its path then exists), else None; `ValueError` once it failed."""
    if stats.get("state") == "failed":
        raise ValueError(f"the stream failed: {stats.get('reason')}")
    if stats.get("rtsp_url") and stats.get("state") == "running":
        return str(stats["rtsp_url"])
    return None


def _wait_for_output(http: httpx.Client, location: str, within_s: float = 30.0) -> str | None:
    """The stream's `rtsp_url` once it is running, or None."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        url = running_output(http.get(location).json())
        if url:
            return url
        time.sleep(0.1)
    return None


async def output_url(http: httpx.AsyncClient, location: str, within_s: float = 30.0) -> str:
    """The stream's `rtsp_url` once it is running, polled without blocking; `ValueError` when it failed or did not
    run within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        url = running_output((await http.get(location)).json())
        if url:
            return url
        await asyncio.sleep(0.1)
    raise ValueError(f"the stream published no rtsp_url within {within_s:.0f} s")


def compare_to_sessions(sessions: list[dict[str, Any]], streams: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each RTSP-ingest cell against the one-session cell of the same server and resolution: fps, latency and the
    server's hop totals as ratios (stream over session; null where either side lacks the figure). The two `total`
    hops may span different stretches (a session's runs to its encoder); `shared_hops` sums the p50s of the hops
    both report, `total` and background work left out, for a like-for-like figure."""
    one = {(c["server"], c["resolution"]): c for c in sessions if c["sessions"] == 1}
    rows = []
    for stream in streams:
        session = one.get((stream["server"], stream["resolution"]))
        if session is None:
            continue
        stream_total = _hop_total(stream["server_hops_ms"])
        session_total = _hop_total(session["server_hops_ms"])
        shared = [
            hop
            for hop in (session["server_hops_ms"] or {})
            if hop in (stream["server_hops_ms"] or {}) and hop not in NOT_SHARED
        ]
        stream_shared = _p50_sum(stream["server_hops_ms"], shared)
        session_shared = _p50_sum(session["server_hops_ms"], shared)
        rows.append(
            {
                "server": stream["server"],
                "resolution": stream["resolution"],
                "rtsp_ingest_fps": stream["fps"],
                "session_fps": session["fps_per_session"],
                "fps_ratio": _ratio(stream["fps"], session["fps_per_session"]),
                "latency_p50_ratio": _ratio(stream["latency_ms"]["p50"], session["latency_ms"]["p50"]),
                "rtsp_ingest_hops_total_p50_ms": stream_total,
                "session_hops_total_p50_ms": session_total,
                "hops_total_ratio": _ratio(stream_total, session_total),
                "shared_hops": shared or None,
                "rtsp_ingest_shared_hops_p50_ms": stream_shared,
                "session_shared_hops_p50_ms": session_shared,
                "shared_hops_ratio": _ratio(stream_shared, session_shared),
            }
        )
    return rows


def _p50_sum(hops: dict[str, dict[str, float]] | None, names: list[str]) -> float | None:
    if not hops or not names:
        return None
    return round(sum(float(hops[name]["p50"]) for name in names), 1)


def _hop_total(hops: dict[str, dict[str, float]] | None) -> float | None:
    total = (hops or {}).get("total") or {}
    value = total.get("p50")
    return float(value) if value is not None else None


def _ratio(ours: float | None, theirs: float | None) -> float | None:
    return round(ours / theirs, 2) if ours is not None and theirs else None
