"""Pushes that reach real servers on this machine, read back by a real client (PyAV, FFmpeg inside, as OBS and
the platforms' ingest are built on): nginx's RTMP module (FLV, H.264 + AAC), and `srt-live-transmit` as an SRT
listener and as a caller of a push that listens (MPEG-TS, encrypted). A publisher's frames carry a coloured
band that the swap keeps, so the readers tell its frames from the slate. A channel's pushes share one encode:
two SRT listeners get the same packets, byte for byte, the later one from a keyframe on."""

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import av
import cv2
import httpx
import numpy as np
import pytest

from app.bench.rtc_client import RtcClient
from app.egress.push_sinks import srt_unavailable_reason
from app.live.channel_feed import default_slate
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.channel_clients import banded
from tests.server.credentials import bearer
from tests.server.harness import LOOPBACK_DESTINATIONS, RunningServer, server_settings, start_server, upload
from tests.server.push_servers import (
    NginxRtmp,
    Reader,
    SrtTransmit,
    free_port,
    nginx_unavailable,
    srt_tools_unavailable,
)

pytestmark = pytest.mark.slow
SIZE = {"width": 320, "height": 240, "fps": 15}
PASSPHRASE = "push-SeCrEt-passphrase"


def small(clip: MotionClip) -> list:
    """The clip at the channels' size (the band keeps its height: the readers look for it there)."""
    return [cv2.resize(frame, (SIZE["width"], SIZE["height"]), interpolation=cv2.INTER_AREA) for frame in clip.frames]


def push_stats(server: RunningServer, channel: str, push_id: str, key: str | None = None) -> dict:
    url = f"{server.base_url}/v1/channels/{channel}/pushes/{push_id}"
    return dict(httpx.get(url, headers=bearer(key), timeout=30).json())


def add_push(server: RunningServer, channel: str, body: dict, key: str | None = None) -> dict:
    url = f"{server.base_url}/v1/channels/{channel}/pushes"
    added = httpx.post(url, json=body, headers=bearer(key), timeout=30)
    assert added.status_code == 201, added.text
    return dict(added.json())


def make_channel(server: RunningServer, name: str, key: str | None = None) -> dict:
    made = httpx.post(f"{server.base_url}/v1/channels", json={"name": name, **SIZE}, headers=bearer(key), timeout=30)
    assert made.status_code == 201, made.text
    return dict(made.json())


class Publisher:
    """A session publishing `frames` into `channel`: an aiortc client on an event loop of its own thread (the
    test's own code goes on blocking, as the readers do)."""

    def __init__(self, server: RunningServer, frames: list, identity: str, channel: str, key: str | None = None):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

        async def connect() -> RtcClient:
            client = RtcClient(frames, fps=SIZE["fps"])
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30, headers=bearer(key)) as http:
                response = await client.connect(http, f"/v1/sessions?identity={identity}&channel={channel}")
                response.raise_for_status()
            return client

        self.client = asyncio.run_coroutine_threadsafe(connect(), self.loop).result(60)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.client.close(), self.loop).result(15)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


@pytest.mark.skipif(nginx_unavailable() is not None, reason=f"no RTMP server: {nginx_unavailable()}")
def test_an_rtmp_push_delivers_the_swapped_channel_with_sound_and_comes_back_after_the_server_does(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, clip: MotionClip
) -> None:
    settings = server_settings(
        tmp_path / "identities", push_retry_s=0.2, push_retry_max_s=1.0, channel_hold_s=60, **LOOPBACK_DESTINATIONS
    )
    with NginxRtmp(tmp_path / "nginx") as nginx, start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        make_channel(server, "live")
        push = add_push(server, "live", {"url": nginx.url("channel-key-1")})
        # A destination that never answers, beside it: it retries on its own thread and holds nothing up.
        dead = add_push(server, "live", {"url": f"rtmp://127.0.0.1:{free_port()}/live/x"})
        publisher = Publisher(server, banded(small(clip), "red"), identity, "live")
        reader = Reader(nginx.url("channel-key-1"))
        try:
            assert wait_for(lambda: reader.seen.first("red") is not None, 90), (
                reader.seen.errors,
                reader.seen.frames[-3:],
            )
            time.sleep(3.0)
            stats = push_stats(server, "live", push["id"])
            assert stats["state"] == "live" and stats["bitrate_kbps"] > 0 and stats["frames_sent"] > 0, stats
            assert push_stats(server, "live", dead["id"])["state"] in ("retrying", "connecting")
            first = reader.seen.first("red") or 0.0
            per_second = reader.seen.per_second(first, first + 3)
            assert min(per_second) >= SIZE["fps"] // 2, per_second  # the channel's rate, not stalled by the dead one
            assert reader.size == (SIZE["width"], SIZE["height"])
            assert reader.audio == {"codec": "aac", "rate": 48000} and reader.audio_samples > 48000, reader.audio
        finally:
            reader.stop()

        # The server goes away and comes back: the push reconnects by itself.
        nginx.stop()
        assert wait_for(lambda: push_stats(server, "live", push["id"])["state"] != "live", 30)
        nginx.start()
        assert wait_for(lambda: push_stats(server, "live", push["id"])["state"] == "live", 60)
        again = Reader(nginx.url("channel-key-1"))
        try:
            assert wait_for(lambda: again.seen.first("red") is not None, 60), again.seen.errors
        finally:
            again.stop()
        stats = push_stats(server, "live", push["id"])
        assert stats["reconnects"] >= 1 and stats["last_error"] is not None, stats
        assert "channel-key-1" not in str(stats)
        publisher.close()


def slate_likeness(path: Path) -> float:
    """The mean absolute difference between the last frame of `path` and the channel's slate."""
    with av.open(str(path)) as container:
        last = None
        for frame in container.decode(video=0):
            last = np.asarray(frame.to_ndarray(format="bgr24"), np.int16)
    assert last is not None
    slate = default_slate(SIZE["width"], SIZE["height"]).astype(np.int16)
    return float(np.abs(cv2.GaussianBlur(last, (5, 5), 0) - cv2.GaussianBlur(slate, (5, 5), 0)).mean())


SRT_MISSING = srt_unavailable_reason() or srt_tools_unavailable()


@pytest.mark.skipif(SRT_MISSING is not None, reason=f"no SRT: {SRT_MISSING}")
def test_srt_pushes_as_caller_and_as_listener_deliver_the_channel_encrypted(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    settings = server_settings(tmp_path / "identities", push_retry_s=0.2, push_retry_max_s=1.0, **LOOPBACK_DESTINATIONS)
    with start_server(settings, pipeline_factory) as server:
        make_channel(server, "srt-out")
        port, listen_port, wrong_port = free_port(), free_port(), free_port()
        listener = SrtTransmit(f"srt://:{port}?mode=listener&passphrase={PASSPHRASE}", tmp_path / "caller.ts")
        wrong = SrtTransmit(f"srt://:{wrong_port}?mode=listener&passphrase=another-passphrase", tmp_path / "x.ts")
        caller_push = add_push(server, "srt-out", {"url": f"srt://127.0.0.1:{port}", "passphrase": PASSPHRASE})
        refused = add_push(server, "srt-out", {"url": f"srt://127.0.0.1:{wrong_port}", "passphrase": PASSPHRASE})
        listen_push = add_push(
            server, "srt-out", {"url": f"srt://:{listen_port}?mode=listener&latency=200", "passphrase": PASSPHRASE}
        )
        try:
            assert wait_for(lambda: push_stats(server, "srt-out", listen_push["id"])["state"] == "waiting", 30)
            caller = SrtTransmit(
                f"srt://127.0.0.1:{listen_port}?mode=caller&passphrase={PASSPHRASE}", tmp_path / "l.ts"
            )
            for push in (caller_push, listen_push):
                assert wait_for(lambda p=push: push_stats(server, "srt-out", p["id"])["state"] == "live", 30)
            time.sleep(4.0)
            said = caller.stop()
            # The refused one fails when its caller gives up (SRT_CONNECT_TIMEOUT_S after its start).
            assert wait_for(lambda: push_stats(server, "srt-out", refused["id"])["last_error"] is not None, 20)
            failed = push_stats(server, "srt-out", refused["id"])
            assert failed["state"] != "live" and failed["last_error"], failed
            assert PASSPHRASE not in str(failed)
        finally:
            said = listener.stop() + wrong.stop()
        for name in ("caller.ts", "l.ts"):
            reader = Reader(str(tmp_path / name))
            reader._thread.join(60)
            assert reader.size == (SIZE["width"], SIZE["height"]), (name, reader.seen.errors, said)
            assert len(reader.seen.frames) >= 2 * SIZE["fps"], len(reader.seen.frames)
            assert reader.audio == {"codec": "aac", "rate": 48000} and reader.audio_samples > 48000
            assert slate_likeness(tmp_path / name) < 12  # nobody publishes: the slate went out


def demuxed(path: Path) -> tuple[list[tuple[bool, bytes]], int, int]:
    """The video packets of an MPEG-TS file in order (keyframe, payload), how many frames its video decodes to,
    and how many sound samples it holds."""
    with av.open(str(path)) as container:
        video = [(p.is_keyframe, bytes(p)) for p in container.demux(video=0) if p.size]
    with av.open(str(path)) as container:
        frames = sum(1 for _ in container.decode(video=0))
    with av.open(str(path)) as container:
        samples = sum(frame.samples for frame in container.decode(audio=0))
    return video, frames, samples


@pytest.mark.skipif(SRT_MISSING is not None, reason=f"no SRT: {SRT_MISSING}")
def test_a_channels_pushes_share_one_encode_and_a_later_one_starts_on_a_keyframe(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, clip: MotionClip
) -> None:
    settings = server_settings(tmp_path / "identities", push_retry_s=0.2, push_retry_max_s=1.0, **LOOPBACK_DESTINATIONS)
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        make_channel(server, "shared")
        publisher = Publisher(server, banded(small(clip), "red"), identity, "shared")  # a picture that moves
        first_port, later_port = free_port(), free_port()
        first = SrtTransmit(f"srt://:{first_port}?mode=listener", tmp_path / "first.ts")
        later = SrtTransmit(f"srt://:{later_port}?mode=listener", tmp_path / "later.ts")
        said = ""
        try:
            one = add_push(server, "shared", {"url": f"srt://127.0.0.1:{first_port}"})
            assert wait_for(lambda: push_stats(server, "shared", one["id"])["state"] == "live", 30)
            time.sleep(2.7)  # into the encode's keyframe interval (2 s): the later push joins between two
            two = add_push(server, "shared", {"url": f"srt://127.0.0.1:{later_port}"})
            assert wait_for(lambda: push_stats(server, "shared", two["id"])["state"] == "live", 30)
            time.sleep(4.0)
            stats = [push_stats(server, "shared", push["id"]) for push in (one, two)]
            assert all(s["state"] == "live" and s["frames_sent"] > 0 for s in stats), stats
        finally:
            said = later.stop() + first.stop()  # the later one ends first: all it got, the first one got too
            publisher.close()
        whole, whole_frames, whole_samples = demuxed(tmp_path / "first.ts")
        joined, joined_frames, joined_samples = demuxed(tmp_path / "later.ts")
        assert len(joined) >= 3 * SIZE["fps"], (len(joined), said)
        # The later push starts on a keyframe, and every packet of either decodes to a frame.
        assert joined[0][0], [key for key, _ in joined[:5]]
        assert (whole_frames, joined_frames) == (len(whole), len(joined))
        assert whole_samples > 48000 and joined_samples > 48000
        # One encode: the later push's packets are the first one's, byte for byte and in order, from where it
        # joined (two encoders would differ: their keyframes fall elsewhere, their rate control has another
        # history). A push may drop packets up to a keyframe, never reorder or change them.
        payloads = [data for _, data in whole]
        at = payloads.index(joined[0][1]) if joined[0][1] in payloads else len(payloads)
        matched = 0
        for _, data in joined:
            while at < len(payloads) and payloads[at] != data:
                at += 1
            if at == len(payloads):
                break
            matched, at = matched + 1, at + 1
        assert matched >= len(joined) - 1, (matched, len(joined))  # its last one may be cut short
