"""The connections `swapcast bench-network` runs through its impairing relay: a session's own client
(`RelayedClient`) and, with `--paths whep`, a WHEP viewer of a session's output (`RelayedViewer`). The
RTSP-ingest paths (`--paths rtsp-udp,rtsp-tcp`) are in `app.bench.network_rtsp`.

For a viewer, the session's own client streams through a clear relay; the receive-only viewer pulls the
session's output over WHEP through a second relay, which applies the profile. The viewer reads the frame ids
stamped by the session's client, so its frames are timed from the moment that client sent them, and reported
as the session's are (`app.bench.network_bench.summarize`), against a clean viewer run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import httpx

from app.bench.impair import UdpRelay
from app.bench.rtc_client import RtcClient
from app.bench.sdp_route import route_candidates
from app.media.recovery import guard_receiver
from app.pipeline.types import Image

PATHS = ("session", "whep", "rtsp-udp", "rtsp-tcp")
RTSP_PATHS = ("rtsp-udp", "rtsp-tcp")  # app.bench.network_rtsp
WHEP_PROFILES = ("clean", "loss5", "outage3")  # the profiles a viewer runs (where asked for)


class RelayedClient(RtcClient):
    """An `RtcClient` whose connection runs through `relay`, counting the RTCP feedback each side sends."""

    def __init__(
        self, frames: Sequence[Image], relay: UdpRelay, *, fps: int, codec: str | None, recovery: bool = False
    ) -> None:
        super().__init__(frames, fps=fps, codec=codec)
        self.relay = relay
        self.recovery = recovery
        # pli_sent / nack_sent: by this client's receiver; keyframe_requests_received: PLI or FIR from the server.
        self.feedback: Counter[str] = Counter()

    def offer_to_post(self, sdp: str) -> str:
        routed, real = route_candidates(sdp, self.relay.server_facing)
        self.relay.connect(client=real)
        return routed

    def answer_to_apply(self, sdp: str) -> str:
        routed, real = route_candidates(sdp, self.relay.client_facing)
        self.relay.connect(server=real)
        self._count_feedback()
        if self.recovery:  # around the counting: what is counted is what leaves
            guard_receiver(self.pc.getTransceivers()[0].receiver)
        return routed

    def _count_feedback(self) -> None:
        # aiortc keeps no count of the feedback it sends or gets; its receiver's senders of PLI and NACK, and its
        # sender's keyframe request, are wrapped on this connection's instances only.
        transceiver = self.pc.getTransceivers()[0]
        receiver, sender = transceiver.receiver, transceiver.sender
        for name, key in (("_send_rtcp_pli", "pli_sent"), ("_send_rtcp_nack", "nack_sent")):
            original = getattr(receiver, name)

            async def counted(*args: Any, _original: Any = original, _key: str = key) -> None:
                self.feedback[_key] += 1
                await _original(*args)

            setattr(receiver, name, counted)
        keyframe = sender._send_keyframe

        def requested() -> None:
            self.feedback["keyframe_requests_received"] += 1
            keyframe()

        setattr(sender, "_send_keyframe", requested)  # noqa: B010 (a method is not assignable when type-checked)

    async def bytes_sent(self) -> int:
        report = await self.pc.getTransceivers()[0].sender.getStats()
        return sum(int(s.bytesSent) for s in report.values() if getattr(s, "type", "") == "outbound-rtp")


class RelayedViewer(RelayedClient):
    """A WHEP viewer of `session`'s output through `relay`: receive only; its frames' ids are the session
    client's, looked up in that client's send times."""

    def __init__(
        self, session: RelayedClient, relay: UdpRelay, frames: list[Image], *, fps: int, recovery: bool = False
    ) -> None:
        super().__init__(frames, relay, fps=fps, codec=None, recovery=recovery)  # its track is never sent
        self.result.sent_at = session.result.sent_at

    def add_video(self) -> None:
        self.pc.addTransceiver("video", direction="recvonly")

    async def connect(self, http: httpx.AsyncClient, url: str) -> httpx.Response:
        response = await super().connect(http, url)
        self.location = None  # the viewer's URL answers DELETE only; the session is watched through its client
        return response

    async def bytes_sent(self) -> int:
        return 0  # a viewer sends no media


async def viewer_stats(http: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    """The server's report of the (one) viewer: frames sent and dropped, keyframe requests passed on."""
    response = await http.get(url)
    viewers = response.json().get("viewers") if response.status_code == 200 else None
    return viewers[0] if viewers else None


def whep_profiles(profiles: Sequence[str]) -> list[str]:
    """The profiles the viewer runs: those of `WHEP_PROFILES` asked for (clean first)."""
    return [p for p in WHEP_PROFILES if p in profiles]


def path_summary(summary: dict[str, Any], path: str) -> dict[str, Any]:
    """A row of another path than the session's: its profile named `path/profile`."""
    return summary | {"profile": f"{path}/{summary['profile']}", "path": path}
