"""The server's RTSP side with the real gst-rtsp-server: a WebRTC session's output and an ingest stream's output
are pulled by PyAV (the library OBS's media source is built on) and carry the swapped frames."""

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import av
import httpx
import numpy as np
import pytest

from app.bench.rtc_client import RtcClient, read_stamp, stamp
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.clips import MotionClip, write_clip
from app.media.rtsp_in import LIVE_OPTIONS
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.harness import RunningServer, server_settings, start_server, upload
from tests.server.test_sessions import face_diff

UNAVAILABLE = rtsp_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")


def pull(url: str, count: int, on_first: Callable[[], None] | None = None) -> list[Image]:
    """Decode `count` frames from an RTSP URL."""
    frames: list[Image] = []
    with av.open(url, options=LIVE_OPTIONS, timeout=(30, 20)) as container:
        for frame in container.decode(video=0):
            frames.append(np.asarray(frame.to_ndarray(format="bgr24"), np.uint8))
            if len(frames) == 1 and on_first is not None:
                on_first()
            if len(frames) >= count:
                break
    return frames


def rtsp_server(identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]) -> RunningServer:
    settings = server_settings(identity_dir, rtsp_enabled=True, rtsp_port=0, allow_file_sources=True)
    return start_server(settings, pipeline_factory)


def check_swapped(frames: list[Image], clip: MotionClip, clip_faces: list[np.ndarray]) -> None:
    stamped = [(read_stamp(f), f) for f in frames]
    readable = [(i, f) for i, f in stamped if i is not None]
    assert len(readable) >= len(frames) // 2, "the frames pulled over RTSP are not ours"
    for frame_id, frame in readable:
        index = frame_id % len(clip.frames)
        assert face_diff(frame, clip.frames[index], clip_faces[index]) > 12


@pytest.mark.slow
def test_a_session_is_published_over_rtsp(
    identity_dir: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
    clip_faces: list[np.ndarray],
) -> None:
    with rtsp_server(identity_dir, pipeline_factory) as server:
        info = httpx.get(f"{server.base_url}/v1/server").json()
        assert info["rtsp"]["available"] is True, info
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        clients_seen: list[float] = []

        def count_clients() -> None:
            text = httpx.get(f"{server.base_url}/metrics").text
            line = next(x for x in text.splitlines() if x.startswith("swapcast_rtsp_clients "))
            clients_seen.append(float(line.split()[1]))

        async def run() -> list[Image]:
            client = RtcClient(clip.frames, fps=15)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                response = await client.connect(http, f"/v1/sessions?identity={identity}")
                url = response.headers["x-rtsp-url"]
                session_id = response.headers["location"].rsplit("/", 1)[1]
                assert url.endswith(f"/session/{session_id}")
                assert await client.wait_frames(3, 60)
                loop = asyncio.get_running_loop()
                frames = await loop.run_in_executor(None, pull, url, 4, count_clients)
                stats = (await http.get(client.location or "")).json()
                assert stats["rtsp_url"] == url
                await client.close()
            return frames

        frames = asyncio.run(run())
        assert clients_seen and clients_seen[0] >= 1
        check_swapped(frames, clip, clip_faces)


@pytest.mark.slow
def test_an_ingest_stream_swaps_a_file_and_publishes_it(
    identity_dir: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
    clip_faces: list[np.ndarray],
    tmp_path: Path,
) -> None:
    frames = [f.copy() for f in clip.frames]
    for i, frame in enumerate(frames):
        stamp(frame, i)
    video = tmp_path / "camera.mp4"
    write_clip(MotionClip(frames, clip.matrices, clip.fps), video, audio_tone_hz=None)

    with rtsp_server(identity_dir, pipeline_factory) as server:
        base = server.base_url
        identity = upload(base, tom_png, "tom.png").json()["id"]
        created = httpx.post(f"{base}/v1/streams", json={"source_url": str(video), "identity": identity})
        assert created.status_code == 201, created.text
        stream = created.json()
        assert stream["rtsp_url"].endswith(f"/stream/{stream['id']}")
        pulled: list[Image] = []
        errors: list[BaseException] = []

        def reader() -> None:
            try:
                pulled.extend(pull(stream["rtsp_url"], 4))
            except BaseException as exc:  # reported by the assertion below
                errors.append(exc)

        thread = threading.Thread(target=reader)
        thread.start()
        thread.join(90)
        assert not thread.is_alive() and not errors, errors
        check_swapped(pulled, clip, clip_faces)

        status = httpx.get(f"{base}/v1/streams/{stream['id']}").json()
        assert status["stats"]["frames_out"] > 0, status
        listed = httpx.get(f"{base}/v1/streams").json()["streams"]
        assert [s["id"] for s in listed] == [stream["id"]]
        assert "swapcast_streams_active 1.0" in httpx.get(f"{base}/metrics").text
        assert httpx.delete(f"{base}/v1/streams/{stream['id']}").status_code == 204
        final = httpx.get(f"{base}/metrics").text
        assert 'swapcast_frames_in_total{kind="stream"} 0.0' not in final
        assert 'swapcast_frames_out_total{kind="stream"} 0.0' not in final
        assert httpx.get(f"{base}/v1/streams/{stream['id']}").status_code == 404
        assert wait_for(lambda: "swapcast_streams_active 0.0" in httpx.get(f"{base}/metrics").text, 5)
