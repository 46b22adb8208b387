"""`swapcast bench-network --paths whep`: a WHEP viewer of a session's output through the impairing relay.

The session's own client streams through a clear relay; a receive-only viewer (`RelayedViewer`) pulls the
session's output over WHEP through a second relay, which applies the profile. The viewer reads the frame ids
stamped by the session's client, so its frames are timed from the moment that client sent them, and reported
as the session's are (`app.bench.network_bench.summarize`), against a clean viewer run.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from aiortc import RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from app.bench.impair import UdpRelay
from app.bench.network_bench import (
    NetworkBenchConfig,
    Profile,
    RelayedClient,
    Run,
    _client,
    _measure,
    connected,
)
from app.bench.server_bench import BenchServer
from app.pipeline.types import Image

PATHS = ("session", "whep")
WHEP_PROFILES = ("clean", "loss5", "outage3")  # the profiles a viewer runs (where asked for)


class RelayedViewer(RelayedClient):
    """A WHEP viewer of `session`'s output through `relay`: receive only; its frames' ids are the session
    client's, looked up in that client's send times."""

    def __init__(
        self, session: RelayedClient, relay: UdpRelay, frames: list[Image], *, fps: int, recovery: bool = False
    ) -> None:
        super().__init__(frames, relay, fps=fps, codec=None, recovery=recovery)  # its track is never sent
        self.result.sent_at = session.result.sent_at

    async def connect(self, http: httpx.AsyncClient, url: str) -> httpx.Response:
        self.pc.addTransceiver("video", direction="recvonly")

        @self.pc.on("track")
        def on_track(track: MediaStreamTrack) -> None:
            if track.kind == "video" and not self._remote.done():
                self._remote.set_result(track)

        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = self.offer_to_post(self.pc.localDescription.sdp)
        response = await http.post(url, content=offer, headers={"Content-Type": "application/sdp"})
        response.raise_for_status()
        self.location = None  # the viewer's URL answers DELETE only; the session is watched through its client
        self.answer = response.text
        await self.pc.setRemoteDescription(
            RTCSessionDescription(sdp=self.answer_to_apply(response.text), type="answer")
        )
        self._reader = asyncio.ensure_future(self._read(await self._remote))
        return response

    async def bytes_sent(self) -> int:
        return 0  # a viewer sends no media


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
                    run.recovery = await _viewer_stats(http, f"{session.location}/whep")
        except (httpx.HTTPError, OSError, ValueError) as exc:
            run.failed = f"{type(exc).__name__}: {exc}"
    run.relay = viewer.relay.counters()
    return viewer, run


async def _viewer_stats(http: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    """The server's report of the (one) viewer: frames sent and dropped, keyframe requests passed on."""
    response = await http.get(url)
    viewers = response.json().get("viewers") if response.status_code == 200 else None
    return viewers[0] if viewers else None


def whep_profiles(config: NetworkBenchConfig) -> list[str]:
    """The profiles the viewer runs: those of `WHEP_PROFILES` asked for (clean first)."""
    return [p for p in WHEP_PROFILES if p in config.profiles]


def path_summary(summary: dict[str, Any], path: str) -> dict[str, Any]:
    """A row of another path than the session's: its profile named `path/profile`."""
    return summary | {"profile": f"{path}/{summary['profile']}", "path": path}
