"""`swapcast bench-return-loss`: how long a receiver that does nothing to repair loss freezes on a session's
return, with the server's own recovery (app.media.sender_recovery) on and off, side by side.

The return path alone, so that no swap engine and no decode of an input compete with it for the cores: a
session's video sender as app.media.webrtc builds it (swapcast's H.264 encoder, the loss-control tap, the
recovery on or off) answers a receive-only offer and sends the benchmark clip through the seeded `UdpRelay`
(app.bench.impair: the same loss both ways) to a plain aiortc receiver (no client-side recovery) or to headless
Chromium's. Each run streams `warmup` clean seconds, then `seconds` with the loss; for each seed the recovery
runs off, then on, so both meet the same losses at the same machine load.

A freeze is a gap over `FREEZE_S` between frames the receiver decoded (aiortc) or presented (Chromium's
`requestVideoFrameCallback`). For aiortc, "held behind a hole" is the longest gap between frames leaving its
jitter buffer while packets kept arriving (`HELD_MIN_PACKETS` or more): the link's doing, not the machine's.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from app.bench.impair import DOWNSTREAM, UPSTREAM, Impairment, UdpRelay
from app.bench.rtc_client import StampedTrack
from app.bench.sdp_route import NoCandidate, route_candidates
from app.bench.server_bench import RESOLUTIONS, bench_clip, machine_report
from app.pipeline.types import Image

RECEIVERS = ("aiortc", "chromium")
FREEZE_S = 0.25  # a gap a viewer notices
HELD_MIN_PACKETS = 5  # packets arriving during a jitter-buffer gap that make it a hole's, not the machine's
FIRST_FRAMES = 25  # frames the receiver must show before the warm-up counts
FIRST_FRAMES_WITHIN_S = 30.0
CLIP_FRAMES = 50
CHROMIUM = Path("/usr/bin/chromium")
# The page is served by Playwright itself (a routed request): nothing leaves the machine.
PAGE_URL = "http://127.0.0.1:9/return-loss"
PAGE_HTML = "<html><body><video id=v autoplay muted playsinline></video></body></html>"
_JITTER_BUFFER = "_RTCRtpReceiver__jitter_buffer"  # aiortc's receiver assembles frames here


@dataclass(frozen=True)
class ReturnLossConfig:
    receivers: tuple[str, ...] = ("aiortc",)
    losses: tuple[float, ...] = (0.01, 0.05)  # share of datagrams lost, each direction
    seeds: tuple[int, ...] = (1, 2, 3)
    seconds: float = 20.0  # with loss, per run
    warmup: float = 2.0  # clean, per run
    resolution: str = "480p"
    fps: int = 25


# ------------------------------------------------------------------------------------------------- the sender


class ReturnSender:
    """A session's return sender (app.media.webrtc's `negotiate`): H.264 with RTX, the client's reports tapped
    for the encoder's rate, and the sender's recovery on or off."""

    def __init__(self, track: MediaStreamTrack, recovery: bool) -> None:
        from app.media.peer import codec_preferences
        from app.media.sender_feedback import tap_sender
        from app.media.sender_recovery import recover_sender

        self.pc = RTCPeerConnection()
        transceiver = self.pc.addTransceiver(track, direction="sendonly")
        transceiver.setCodecPreferences(codec_preferences(["H264"]))
        tap = tap_sender(transceiver.sender)
        self.recovery = recover_sender(transceiver.sender, recovery, tap.resent if tap is not None else None)
        if tap is not None and self.recovery is not None and self.recovery.enabled:
            tap.count_nacks = False

    async def answer(self, offer: str) -> str:
        await self.pc.setRemoteDescription(RTCSessionDescription(offer, "offer"))
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        return str(self.pc.localDescription.sdp)

    def counts(self) -> dict[str, int]:
        return self.recovery.counts.as_dict() if self.recovery is not None else {}


# ------------------------------------------------------------------------------------------------- receivers


class Receiver(Protocol):
    async def offer(self) -> str: ...
    async def accept(self, answer: str) -> None: ...
    async def shown(self) -> int: ...
    async def now(self) -> float: ...
    async def frame_times(self) -> list[float]: ...  # on `now`'s clock, seconds
    async def mark(self) -> None: ...  # the loss starts: `stats` counts from here
    async def stats(self) -> dict[str, Any]: ...
    def held_behind_hole(self, start: float, end: float) -> list[float] | None: ...  # monotonic; None: unknown
    async def close(self) -> None: ...


class AiortcReceiver:
    """A receive-only aiortc peer as a plain client makes it: aiortc's jitter buffer and NACKs, nothing more.
    Its jitter buffer is watched (not changed) for frames held behind a hole."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.decoded: list[float] = []
        self.assembled: list[float] = []  # frames leaving the jitter buffer
        self.packets: list[float] = []  # packets entering it
        self._tasks: list[asyncio.Task[None]] = []
        self.pc.on("track", lambda track: self._tasks.append(asyncio.ensure_future(self._read(track))))
        transceiver = self.pc.addTransceiver("video", direction="recvonly")
        buffer = getattr(transceiver.receiver, _JITTER_BUFFER, None)
        if buffer is not None:
            add = buffer.add

            def watched(packet: Any) -> Any:
                now = time.monotonic()
                self.packets.append(now)
                pli, frame = add(packet)
                if frame is not None:
                    self.assembled.append(now)
                return pli, frame

            buffer.add = watched
        self.watched = buffer is not None

    async def _read(self, track: MediaStreamTrack) -> None:
        while True:
            try:
                await track.recv()
            except MediaStreamError:
                return
            self.decoded.append(time.monotonic())

    async def offer(self) -> str:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        return str(self.pc.localDescription.sdp)

    async def accept(self, answer: str) -> None:
        await self.pc.setRemoteDescription(RTCSessionDescription(answer, "answer"))

    async def shown(self) -> int:
        return len(self.decoded)

    async def now(self) -> float:
        return time.monotonic()

    async def frame_times(self) -> list[float]:
        return list(self.decoded)

    async def mark(self) -> None:
        pass

    async def stats(self) -> dict[str, Any]:
        return {}

    def held_behind_hole(self, start: float, end: float) -> list[float] | None:
        """Gaps over `FREEZE_S` in frames leaving the jitter buffer while packets kept arriving."""
        if not self.watched:
            return None
        times = [start, *(t for t in self.assembled if start <= t <= end), end]
        return [
            b - a
            for a, b in zip(times, times[1:], strict=False)
            if b - a > FREEZE_S and sum(1 for t in self.packets if a < t < b) >= HELD_MIN_PACKETS
        ]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await self.pc.close()


PAGE_OFFER = """async () => {
  const video = document.getElementById('v');
  window.times = [];
  // A camera's permission makes Chromium offer its real (loopback) address rather than an mDNS name.
  (await navigator.mediaDevices.getUserMedia({video: true})).getTracks().forEach((t) => t.stop());
  const pc = window.pc = new RTCPeerConnection();
  pc.addTransceiver('video', {direction: 'recvonly'});
  pc.ontrack = (e) => {
    video.srcObject = new MediaStream([e.track]);
    const tick = (now) => { window.times.push(now); video.requestVideoFrameCallback(tick); };
    video.requestVideoFrameCallback(tick);
    video.play();
  };
  await pc.setLocalDescription(await pc.createOffer());
  await new Promise((done) => {
    if (pc.iceGatheringState === 'complete') done();
    pc.onicegatheringstatechange = () => { if (pc.iceGatheringState === 'complete') done(); };
  });
  return pc.localDescription.sdp;
}"""

PAGE_STATS = """async () => {
  const out = {};
  (await window.pc.getStats()).forEach((s) => {
    if (s.type === 'inbound-rtp' && s.kind === 'video') {
      for (const k of ['framesDecoded', 'framesDropped', 'nackCount', 'pliCount', 'freezeCount',
                       'totalFreezesDuration', 'packetsLost', 'retransmittedPacketsReceived']) out[k] = s[k] || 0;
    }
  });
  return out;
}"""

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--autoplay-policy=no-user-gesture-required",
    "--allow-loopback-in-peer-connection",
    "--disable-features=WebRtcHideLocalIpsWithMdns",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]


class ChromiumReceiver:
    """A page in headless Chromium receiving the return: libwebrtc's jitter buffer, NACKs and PLIs."""

    def __init__(self, page: Any) -> None:
        self.page = page
        self._before: dict[str, Any] = {}

    @classmethod
    async def open(cls, browser: Any) -> ChromiumReceiver:
        page = await browser.new_page()
        await page.route(PAGE_URL, lambda route: route.fulfill(body=PAGE_HTML, content_type="text/html"))
        await page.goto(PAGE_URL)
        return cls(page)

    async def offer(self) -> str:
        sdp = str(await self.page.evaluate(PAGE_OFFER))
        # Loopback candidates only: the relay stands in for one of them, and nothing else is dialled.
        lines = sdp.split("\r\n")
        return "\r\n".join(line for line in lines if not line.startswith("a=candidate:") or " 127.0.0.1 " in line)

    async def accept(self, answer: str) -> None:
        await self.page.evaluate("(sdp) => window.pc.setRemoteDescription({type: 'answer', sdp})", answer)

    async def shown(self) -> int:
        return int(await self.page.evaluate("window.times.length"))

    async def now(self) -> float:
        return float(await self.page.evaluate("performance.now()")) / 1000.0

    async def frame_times(self) -> list[float]:
        return [t / 1000.0 for t in await self.page.evaluate("window.times")]

    async def mark(self) -> None:
        self._before = await self.page.evaluate(PAGE_STATS)

    async def stats(self) -> dict[str, Any]:
        after = await self.page.evaluate(PAGE_STATS)
        return {k: round(v - self._before.get(k, 0), 3) for k, v in after.items()}

    def held_behind_hole(self, start: float, end: float) -> list[float] | None:
        return None  # libwebrtc's jitter buffer is not watched

    async def close(self) -> None:
        await self.page.close()


# ------------------------------------------------------------------------------------------------- one run


def gaps_between(times: Sequence[float], start: float, end: float) -> list[float]:
    """The gaps between frames shown in [start, end], the window's edges counting as frames."""
    inside = [start, *(t for t in times if start <= t <= end), end]
    return [b - a for a, b in zip(inside, inside[1:], strict=False)]


async def _connect(receiver: Receiver, sender: ReturnSender, relay: UdpRelay) -> None:
    try:
        offer, client = route_candidates(await receiver.offer(), relay.server_facing)
        relay.connect(client=client)
        answer, server = route_candidates(await sender.answer(offer), relay.client_facing)
    except NoCandidate as exc:
        raise RuntimeError(f"no loopback candidate to route through the relay: {exc}") from None
    relay.connect(server=server)
    await receiver.accept(answer)
    deadline = time.monotonic() + FIRST_FRAMES_WITHIN_S
    while await receiver.shown() < FIRST_FRAMES:
        if time.monotonic() > deadline:
            raise RuntimeError(f"the receiver showed no {FIRST_FRAMES} frames within {FIRST_FRAMES_WITHIN_S:g} s")
        await asyncio.sleep(0.1)


async def run_once(
    receiver: Receiver, frames: Sequence[Image], loss: float, seed: int, recovery: bool, config: ReturnLossConfig
) -> dict[str, Any]:
    """One receiver through one seeded loss: the gaps it showed and what the sender did."""
    relay = UdpRelay(seed=seed)
    await relay.start()
    sender = ReturnSender(StampedTrack(frames, config.fps), recovery)
    try:
        await _connect(receiver, sender, relay)
        await asyncio.sleep(config.warmup)
        await receiver.mark()
        start = await receiver.now()
        started = time.monotonic()
        relay.impair(Impairment(loss=loss))
        await asyncio.sleep(config.seconds)
        end = await receiver.now()
        gaps = gaps_between(await receiver.frame_times(), start, end)
        held = receiver.held_behind_hole(started, time.monotonic())
        counters = relay.counters()
        return {
            "fps": round((len(gaps) - 1) / (end - start), 1),
            "gaps": gaps,
            "longest_freeze_ms": round(max(gaps) * 1000),
            "freezes": sum(1 for g in gaps if g > FREEZE_S),
            "held_behind_hole_ms": None if held is None else round(max(held, default=0.0) * 1000),
            "lost_down": counters[DOWNSTREAM]["dropped"].get("loss", 0),
            "lost_up": counters[UPSTREAM]["dropped"].get("loss", 0),
            "sender": sender.counts(),
            "receiver": await receiver.stats(),
        }
    finally:
        await receiver.close()
        await sender.pc.close()
        relay.close()


# ------------------------------------------------------------------------------------------------- the bench


def _group(
    receiver: str, loss: float, recovery: bool, seeds: Sequence[int], runs: list[dict[str, Any]]
) -> dict[str, Any]:
    gaps_ms = np.array([g * 1000 for run in runs for g in run["gaps"]]) if runs else np.zeros(1)

    def each(key: str) -> list[Any]:
        return [run[key] for run in runs]

    def sent(key: str) -> list[int | None]:
        return [run["sender"].get(key) for run in runs]

    group: dict[str, Any] = {
        "receiver": receiver,
        "loss": loss,
        "recovery": recovery,
        "seeds": list(seeds),
        "longest_freeze_ms": each("longest_freeze_ms"),
        "freezes_over_250ms": each("freezes"),
        "gap_ms": {"p50": round(float(np.percentile(gaps_ms, 50))), "p99": round(float(np.percentile(gaps_ms, 99)))},
        "held_behind_hole_ms": each("held_behind_hole_ms"),
        "fps": each("fps"),
        "lost": {"down": each("lost_down"), "up": each("lost_up")},
        "nacks": sent("nacks"),
        "nacked": sent("nacked"),
        "resent": sent("resent"),
        "not_in_history": sent("not_in_history"),
        "probes": sent("probes"),
        "keyframe_requests": sent("keyframe_requests"),
    }
    if receiver == "chromium":
        group["chromium"] = each("receiver")
    return group


def chromium_unavailable() -> str | None:
    if not CHROMIUM.exists():
        return f"--receivers chromium needs Chromium at {CHROMIUM} (apt chromium)"
    try:
        import playwright.async_api  # noqa: F401
    except ImportError:
        return "--receivers chromium needs Playwright (pip install playwright)"
    return None


async def _run_all(
    config: ReturnLossConfig, frames: list[Image], progress: Callable[[str], None]
) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    async with AsyncExitStack() as stack:
        browser: Any = None
        if "chromium" in config.receivers:
            from playwright.async_api import async_playwright

            playwright = await stack.enter_async_context(async_playwright())
            browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            stack.push_async_callback(browser.close)
        for kind in config.receivers:
            for loss in config.losses:
                runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
                for seed in config.seeds:
                    for recovery in (False, True):  # side by side: the same losses, the same load
                        receiver: Receiver = (
                            AiortcReceiver() if kind == "aiortc" else await ChromiumReceiver.open(browser)
                        )
                        run = await run_once(receiver, frames, loss, seed, recovery, config)
                        runs[recovery].append(run)
                        progress(
                            f"{kind} loss {loss:g} seed {seed} recovery {'on' if recovery else 'off'}: "
                            f"longest {run['longest_freeze_ms']} ms, held {run['held_behind_hole_ms']} ms"
                        )
                for recovery in (False, True):
                    groups.append(_group(kind, loss, recovery, config.seeds, runs[recovery]))
    return groups


def run_return_loss_bench(config: ReturnLossConfig, progress: bool = True) -> dict[str, Any]:
    unknown = [r for r in config.receivers if r not in RECEIVERS]
    if unknown:
        raise ValueError(f"unknown receiver {unknown[0]!r}")
    if "chromium" in config.receivers and (reason := chromium_unavailable()) is not None:
        raise RuntimeError(reason)
    from app.media.encoder import configure_encoders, install_timed_encoders
    from app.media.peer import use_host_addresses
    from app.settings import EncoderSettings

    configure_encoders(EncoderSettings())  # the server's encoder settings (SWAPCAST_ENCODER_*)
    install_timed_encoders()
    use_host_addresses(["127.0.0.1"])  # one loopback candidate for the relay to stand in for
    frames = bench_clip(config.resolution, CLIP_FRAMES)
    started = time.perf_counter()
    load_before = os.getloadavg()

    def say(line: str) -> None:
        if progress:
            print(line, file=sys.stderr)

    groups = asyncio.run(_run_all(config, frames, say))
    return {
        "config": asdict(config) | {"size": list(RESOLUTIONS[config.resolution]), "freeze_ms": FREEZE_S * 1000},
        "machine": machine_report(load_before[0]),
        "groups": groups,
        "seconds": round(time.perf_counter() - started, 1),
    }
