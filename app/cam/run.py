"""`swapcast cam` end to end: the camera, the sink, and sessions with the server, a new one (after a backoff, as
the page waits) whenever the link is lost, until the time is up or the user stops it."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

import httpx

from app.cam.camera import Camera
from app.cam.link import Link, Refused
from app.cam.sink_worker import SinkWorker
from app.cam.sinks import Sink
from app.cam.stats import CamStats
from app.errors import UserError

BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 10.0)
RETRY_AFTER_MAX_S = 300.0
STABLE_S = 10.0  # live this long: the next loss starts the backoff from its first step


@dataclass(frozen=True)
class CamOptions:
    server: str
    camera: str
    identity: str | None = None
    channel: str | None = None
    size: tuple[int, int] | None = None
    fps: int | None = None
    seconds: float | None = None
    key: str | None = None
    measure: bool = False
    stats_every_s: float | None = None


def session_url(options: CamOptions) -> str:
    query = {name: value for name, value in (("identity", options.identity), ("channel", options.channel)) if value}
    return f"{options.server.rstrip('/')}/v1/sessions" + (f"?{urlencode(query)}" if query else "")


def _say(message: str) -> None:
    print(f"swapcast cam: {message}", file=sys.stderr, flush=True)


def run_cam(options: CamOptions, sink: Sink, stats: CamStats, ask_key: Callable[[], str | None] = lambda: None) -> None:
    """Run until `options.seconds` pass (for ever without) or the user stops it; counts go to `stats`. Raises
    UserError for what cannot be fixed by trying again."""
    camera = Camera(options.camera, size=options.size, fps=options.fps)
    worker = SinkWorker(sink, stats, measure=options.measure)
    try:
        worker.start(camera.width, camera.height, camera.fps)
        asyncio.run(_stream(options, camera, worker, stats, ask_key))
    finally:
        worker.stop()
        camera.close()


async def _stream(
    options: CamOptions, camera: Camera, worker: SinkWorker, stats: CamStats, ask_key: Callable[[], str | None]
) -> None:
    camera.start()
    until = time.monotonic() + options.seconds if options.seconds is not None else None
    reporter = asyncio.ensure_future(_report(stats, options.stats_every_s)) if options.stats_every_s else None
    key, asked = options.key, False
    failures, ever_live = 0, False
    url = session_url(options)
    try:
        async with httpx.AsyncClient(timeout=30) as http:
            while until is None or time.monotonic() < until:
                headers = {"X-Swapcast": "1"} | ({"Authorization": f"Bearer {key}"} if key else {})
                link = Link(camera, worker, stats, measure=options.measure)
                retry_after: float | None = None
                try:
                    await link.open(http, url, headers)
                    reason = await link.wait_lost(until)
                    ever_live = ever_live or link.last_frame_at is not None
                    if link.live_for >= STABLE_S:
                        failures = 0
                    if reason is None:
                        return
                except Refused as refused:
                    if refused.status == 401 and not key and not asked:
                        asked, key = True, ask_key()
                        if key:
                            continue
                    if refused.permanent:
                        raise UserError(f"the server refused the session: {refused}") from None
                    reason, retry_after = str(refused), refused.retry_after_s
                except httpx.HTTPError as exc:
                    if not ever_live:
                        problem = str(exc) or type(exc).__name__
                        raise UserError(f"cannot reach the server at {options.server}: {problem}") from None
                    reason = f"cannot reach the server ({exc or type(exc).__name__})"
                finally:
                    await link.close(http, headers)
                failures += 1
                delay = BACKOFF_S[min(failures, len(BACKOFF_S)) - 1] * (1 + 0.25 * random.random())
                if retry_after is not None:
                    delay = max(delay, min(retry_after, RETRY_AFTER_MAX_S))
                _say(f"{reason}; reconnecting in {delay:.0f} s (attempt {failures})")
                await asyncio.sleep(delay if until is None else max(0.0, min(delay, until - time.monotonic())))
    finally:
        camera.stop()
        if reporter is not None:
            reporter.cancel()


async def _report(stats: CamStats, every_s: float) -> None:
    while True:
        await asyncio.sleep(every_s)
        _say(stats.line())
