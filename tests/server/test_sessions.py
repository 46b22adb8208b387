"""WebRTC sessions end to end: a real aiortc client sends a real face clip with frame ids stamped in pixels
to a real server on 127.0.0.1 and checks what comes back."""

import asyncio
import gc
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from aiortc import RTCPeerConnection

from app.bench.rtc_client import RtcClient, read_stamp
from app.identity.images import decode_image
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.harness import RunningServer, server_settings, start_server, upload

REPO = Path(__file__).resolve().parents[2]


def face_diff(a: Image, b: Image, box: np.ndarray, shrink: float = 0.25) -> float:
    """Mean absolute difference inside the middle of a face box."""
    x1, y1, x2, y2 = (float(v) for v in box)
    dx, dy = (x2 - x1) * shrink, (y2 - y1) * shrink
    ys, xs = slice(int(y1 + dy), int(y2 - dy)), slice(int(x1 + dx), int(x2 - dx))
    return float(np.abs(a[ys, xs].astype(np.int16) - b[ys, xs].astype(np.int16)).mean())


def background_diff(a: Image, b: Image) -> float:
    """Mean absolute difference in the top-right corner, far from the face and from the stamp."""
    w = a.shape[1]
    return float(np.abs(a[8:72, w - 136 : w - 8].astype(np.int16) - b[8:72, w - 136 : w - 8].astype(np.int16)).mean())


def identity_id(server: RunningServer, data: bytes, name: str) -> str:
    response = upload(server.base_url, data, name)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


@pytest.mark.slow
def test_swapped_frames_come_back_in_order_with_the_face_changed_and_the_stamp_intact(
    server: RunningServer, tom_png: bytes, clip: MotionClip, clip_faces: list[np.ndarray]
) -> None:
    identity = identity_id(server, tom_png, "tom.png")

    async def run() -> tuple[RtcClient, httpx.Response, dict]:
        client = RtcClient(clip.frames, fps=15, keep_images=True)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            response = await client.connect(http, f"/v1/sessions?identity={identity}")
            assert await client.wait_frames(20, 90), f"only {len(client.result.received)} frames came back"
            stats = (await http.get(client.location or "")).json()
            await client.close()
        return client, response, stats

    client, response, stats = asyncio.run(run())
    assert response.status_code == 201
    assert response.headers["content-type"].startswith("application/sdp")
    assert response.headers["location"].startswith("/v1/sessions/")
    assert stats["codec"] == "H264"  # preferred by default

    ids = client.result.ids()
    assert ids == sorted(set(ids)), f"frames out of order or repeated: {ids}"
    assert client.result.unreadable <= 1
    n = len(clip.frames)
    for received in client.result.received:
        assert received.image is not None
        sent = clip.frames[received.frame_id % n]
        assert read_stamp(received.image) == received.frame_id
        face = face_diff(received.image, sent, clip_faces[received.frame_id % n])
        noise = background_diff(received.image, sent)
        assert face > 12 and face > 3 * noise, (received.frame_id, face, noise)

    # Every frame in is accounted for: sent on, dropped with a reason, or still in flight (at most 3).
    unaccounted = stats["frames_in"] - stats["frames_out"] - stats["dropped"]
    assert 0 <= unaccounted <= 3, stats
    assert stats["frames_out"] >= 20
    assert set(stats["drops"]) <= {"superseded", "output_superseded"}
    assert stats["latency_ms"]["p50"] is not None
    # Where the time went, hop by hop: decoded → queue → stages → output_wait → encode (total spans them).
    hops = stats["hops_ms"]
    assert {"queue", "convert_in", "detect", "track", "swap", "paste", "output_wait", "encode", "total"} <= set(hops)
    assert hops["total"]["p50"] >= hops["encode"]["p50"] + hops["swap"]["p50"], hops
    assert 'swapcast_hop_seconds_count{hop="encode",kind="session"}' in httpx.get(f"{server.base_url}/metrics").text

    session_url = f"{server.base_url}{response.headers['location']}"
    assert wait_for(lambda: httpx.get(session_url).status_code == 404, 15), "session outlived its client"


@pytest.fixture(scope="module")
def inline_detection_server(
    tmp_path_factory: pytest.TempPathFactory, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> Iterator[RunningServer]:
    """A server detecting every live frame inline, so that each output frame can be reproduced offline.

    With detection in the background, faces between detections are placed by the tracker: a few pixels off
    a fresh detection's place, which moved the centre of a face by ~25 grey levels from its offline
    reproduction, as far as the other identity's reproduction was (the switch itself was right)."""
    settings = server_settings(
        tmp_path_factory.mktemp("identities"),
        pipeline=PipelineSettings(engine="classic", live_detect_background=False),
    )
    running = start_server(settings, pipeline_factory)
    yield running
    running.stop()


@pytest.mark.slow
def test_identity_switch_mid_stream_changes_the_output(
    inline_detection_server: RunningServer,
    tom_png: bytes,
    t1_face_jpeg: bytes,
    clip: MotionClip,
    clip_faces: list[np.ndarray],
    local_pipeline: FramePipeline,
) -> None:
    server = inline_detection_server
    first = identity_id(server, tom_png, "tom.png")
    second = identity_id(server, t1_face_jpeg, "t1.jpg")
    sources = [local_pipeline.prepare_source(decode_image(data, 10**8)[0]) for data in (tom_png, t1_face_jpeg)]

    async def run() -> tuple[RtcClient, float, float, dict]:
        client = RtcClient(clip.frames, fps=15, keep_images=True)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            await client.connect(http, f"/v1/sessions?identity={first}")
            assert await client.wait_frames(8, 90)
            before = time.monotonic()
            switched = await http.patch(client.location or "", json={"identity": second})
            after = time.monotonic()
            assert switched.status_code == 200, switched.text
            assert switched.json()["identity"] == second
            count = len(client.result.received)
            assert await client.wait_frames(count + 10, 90)
            await http.delete(client.location or "")
            stats = switched.json()
            await client.close()
        return client, before, after, stats

    client, before, after, _ = asyncio.run(run())
    n = len(clip.frames)
    verdicts: dict[str, list[bool]] = {"before": [], "after": []}
    for received in client.result.received:
        sent_at = client.result.sent_at[received.frame_id]
        if received.at < before:
            phase = "before"
        elif sent_at > after:
            phase = "after"
        else:
            continue  # in flight during the switch: either identity is right
        assert received.image is not None
        frame = clip.frames[received.frame_id % n]
        box = clip_faces[received.frame_id % n]
        expected = [local_pipeline.process([frame], source)[0].image for source in sources]
        to_first, to_second = (face_diff(received.image, e, box) for e in expected)
        verdicts[phase].append(to_first < to_second if phase == "before" else to_second < to_first)
    assert len(verdicts["before"]) >= 5 and len(verdicts["after"]) >= 5, verdicts
    assert all(verdicts["before"]), verdicts
    assert all(verdicts["after"]), verdicts


@pytest.mark.slow
def test_admission_limit_answers_503_with_retry_after_and_vp8_is_served_when_preferred(
    identity_dir: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
) -> None:
    settings = server_settings(identity_dir, max_sessions=1, video_codecs=["VP8", "H264"])
    with start_server(settings, pipeline_factory) as server:
        identity = identity_id(server, tom_png, "tom.png")

        async def run() -> None:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                first = RtcClient(clip.frames, fps=15)
                await first.connect(http, f"/v1/sessions?identity={identity}")
                assert await first.wait_frames(3, 60)
                stats = (await http.get(first.location or "")).json()
                assert stats["codec"] == "VP8"

                second = RtcClient(clip.frames, fps=15)
                with pytest.raises(httpx.HTTPStatusError) as refused:
                    await second.connect(http, f"/v1/sessions?identity={identity}")
                assert refused.value.response.status_code == 503
                assert refused.value.response.headers["retry-after"] == "5"
                assert "session slots" in refused.value.response.json()["detail"]
                await second.close()

                assert (await http.delete(first.location or "")).status_code == 204
                assert (await http.get(first.location or "")).status_code == 404
                await first.close()

                third = RtcClient(clip.frames, fps=15)
                await third.connect(http, f"/v1/sessions?identity={identity}")
                assert await third.wait_frames(2, 60)
                await third.close()

        asyncio.run(run())
        metrics = httpx.get(f"{server.base_url}/metrics").text
        assert 'swapcast_admission_rejections_total{reason="capacity",resource="session"} 1.0' in metrics


@pytest.mark.slow
def test_a_client_that_vanishes_mid_stream_is_cleaned_up(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    settings = server_settings(identity_dir, media_timeout_s=2.0)
    with start_server(settings, pipeline_factory) as server:
        identity = identity_id(server, tom_png, "tom.png")
        baseline_tasks = server.task_names()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.server.vanishing_client", server.base_url, identity],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert proc.stdout is not None
            location = proc.stdout.readline().strip()
            assert location.startswith("/v1/sessions/"), location
            assert proc.stdout.readline().strip() == "STREAMING"
            assert len(server.state.sessions or []) == 1
            assert any(name.startswith("session-") for name in server.task_names())
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

        assert wait_for(lambda: len(server.state.sessions or []) == 0, 30), "vanished client's session remains"
        assert httpx.get(f"{server.base_url}{location}").status_code == 404
        assert wait_for(lambda: len(server.task_names()) <= len(baseline_tasks), 10), (
            f"tasks left behind: {sorted(set(server.task_names()) - set(baseline_tasks))}"
        )
        metrics = httpx.get(f"{server.base_url}/metrics").text
        assert 'swapcast_sessions_closed_total{reason="media timeout"} 1.0' in metrics
        assert "swapcast_sessions_active 0.0" in metrics

    def live_peer_connections() -> int:
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, RTCPeerConnection) and o.connectionState != "closed")

    assert live_peer_connections() == 0


@pytest.mark.slow
def test_shutdown_closes_open_sessions_within_the_grace_period(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, clip: MotionClip
) -> None:
    server = start_server(server_settings(identity_dir, shutdown_grace_s=5.0), pipeline_factory)
    identity = identity_id(server, tom_png, "tom.png")

    async def run() -> None:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            client = RtcClient(clip.frames, fps=15)
            await client.connect(http, f"/v1/sessions?identity={identity}")
            assert await client.wait_frames(2, 60)
            assert server.state.sessions is not None
            (session,) = server.state.sessions.sessions()
            await asyncio.get_running_loop().run_in_executor(None, server.stop)
            assert session.close_reason == "shutdown"
            assert session.state == "closed"
            assert server.state.ready is False
            await client.close()

    asyncio.run(run())
    assert not server.thread.is_alive()


@pytest.mark.slow
def test_churn_leaves_no_sessions_tasks_threads_or_peer_connections(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes, clip: MotionClip
) -> None:
    import threading

    def other_threads() -> list[str]:
        """Threads other than executor pools (which grow to their size and stay): per-session codec threads."""
        pools = ("asyncio_", "uvloop_", "swapcast-", "ThreadPoolExecutor", "AnyIO worker")
        return [t.name for t in threading.enumerate() if not t.name.startswith(pools)]

    def session_threads() -> int:
        return len(other_threads())

    with start_server(server_settings(identity_dir, max_sessions=4), pipeline_factory) as server:
        identity = identity_id(server, tom_png, "tom.png")
        frames = clip.frames[:10]

        async def cycle(http: httpx.AsyncClient, index: int) -> None:
            client = RtcClient(frames, fps=15)
            await client.connect(http, f"/v1/sessions?identity={identity}")
            assert await client.wait_frames(1, 60)
            if index % 2 == 0:
                assert (await http.delete(client.location or "")).status_code == 204
            await client.close()

        async def run() -> None:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                await cycle(http, 0)
                baseline_threads = session_threads()
                baseline_tasks = len(server.task_names())
                for round_ in range(4):
                    await asyncio.gather(cycle(http, 2 * round_), cycle(http, 2 * round_ + 1))
                assert await asyncio.get_running_loop().run_in_executor(
                    None, wait_for, lambda: len(server.state.sessions or []) == 0, 20
                )
                settled = await asyncio.get_running_loop().run_in_executor(
                    None,
                    wait_for,
                    lambda: len(server.task_names()) <= baseline_tasks and session_threads() <= baseline_threads,
                    20,
                )
                assert settled, (server.task_names(), other_threads())

        asyncio.run(run())
        metrics = httpx.get(f"{server.base_url}/metrics").text
        assert "swapcast_sessions_active 0.0" in metrics

    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, RTCPeerConnection) and o.connectionState != "closed"]
