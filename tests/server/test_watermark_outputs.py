"""Every live output carries the watermark: an ingest stream's RTSP output, read live and as a recording with
ffmpeg, gives back the payload issued to that stream; a session's WebRTC return carries its own, and the
visible label when the session asks for it."""

import asyncio
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.bench.rtc_client import RtcClient
from app.cli import main
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.clips import MotionClip, write_clip
from app.pipeline.pipeline import FramePipeline
from app.provenance.detect import detect_windows
from app.provenance.service import Provenance
from app.settings import PipelineSettings
from tests.server.harness import server_settings, start_server, upload

UNAVAILABLE = rtsp_unavailable_reason()


@pytest.mark.slow
@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")
@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg is not installed")
def test_stream_output_over_rtsp_carries_the_streams_mark(
    identity_dir: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    video = tmp_path / "camera.mp4"
    write_clip(clip, video, audio_tone_hz=None)
    settings = server_settings(identity_dir, rtsp_enabled=True, rtsp_port=0, allow_file_sources=True)
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        created = httpx.post(f"{server.base_url}/v1/streams", json={"source_url": str(video), "identity": identity})
        assert created.status_code == 201, created.text
        stream = created.json()
        assert stream["provenance"]["label"] is False and len(stream["provenance"]["watermark"]) == 12

        assert main(["watermark", "detect", stream["rtsp_url"], "--seconds", "2"]) == 0
        printed = capsys.readouterr().out
        assert f"issued to: stream {stream['id']}, identity {identity}, owner local" in printed

        recording = tmp_path / "recording.mp4"
        subprocess.run(
            ["ffmpeg", "-loglevel", "error", "-rtsp_transport", "tcp", "-i", stream["rtsp_url"], "-frames:v", "60",
             "-c", "copy", str(recording)],
            check=True, timeout=120,
        )  # fmt: skip
        assert main(["watermark", "detect", str(recording)]) == 0
        assert f"issued to: stream {stream['id']}" in capsys.readouterr().out
        assert httpx.delete(f"{server.base_url}/v1/streams/{stream['id']}").status_code == 204


@pytest.mark.slow
def test_session_return_video_carries_the_sessions_mark(
    identity_dir: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
) -> None:
    with start_server(server_settings(identity_dir), pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]

        async def run() -> tuple[RtcClient, str]:
            client = RtcClient(clip.frames, fps=15, keep_images=True)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                await client.connect(http, f"/v1/sessions?identity={identity}&label=true")
                session_id = (client.location or "").rsplit("/", 1)[1]
                assert await client.wait_frames(15, 90)
                stats = (await http.get(client.location or "")).json()
                assert stats["provenance"]["label"] is True
                await client.close()
            return client, session_id

        client, session_id = asyncio.run(run())
    images = [r.image for r in client.result.received if r.image is not None]
    h, w = images[-1].shape[:2]
    box = (slice(h - 20, h - 8), slice(w - 100, w - 10))  # inside the label's dark box, bottom right
    darker = images[-1][box].astype(float).mean(axis=2) < 0.5 * clip.frames[0][box].astype(float).mean(axis=2)
    assert darker.mean() > 0.5, darker.mean()
    provenance = Provenance()
    (result,) = detect_windows(images[-15:], provenance.code, window=15)
    assert result.found and result.payload is not None
    (record,) = provenance.registry.lookup(result.payload)
    assert (record.kind, record.ref, record.identity, record.owner) == ("session", session_id, identity, "local")
