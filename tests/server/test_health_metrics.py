"""Liveness, strict readiness, and the Prometheus metrics a session moves."""

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from app.bench.rtc_client import RtcClient
from app.errors import ModelError
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import RunningServer, server_settings, start_server, upload


def scrape(server: RunningServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    response = httpx.get(f"{server.base_url}/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return float(samples.get((name, tuple(sorted(labels.items()))), 0.0))


def test_not_ready_until_the_pipeline_is_loaded_and_warm(
    identity_dir: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    release = threading.Event()

    def slow_factory(settings: PipelineSettings) -> FramePipeline:
        assert release.wait(60)
        return pipeline_factory(settings)

    with start_server(server_settings(identity_dir), slow_factory, wait_ready=False) as server:
        base = server.base_url
        assert httpx.get(f"{base}/healthz").status_code == 200
        not_ready = httpx.get(f"{base}/readyz")
        assert not_ready.status_code == 503
        assert not_ready.json() == {"status": "not ready", "reason": "loading models"}
        assert not_ready.headers["retry-after"] == "5"
        refused = httpx.post(
            f"{base}/v1/sessions?identity=x", content="v=0", headers={"Content-Type": "application/sdp"}
        )
        assert refused.status_code == 503 and "loading models" in refused.json()["detail"]
        assert upload(base, tom_png).status_code == 503
        assert httpx.get(f"{base}/v1/identities").status_code == 200  # listing needs no model
        assert value(scrape(server), "swapcast_ready") == 0.0

        release.set()
        server.wait_ready(60)
        ready = httpx.get(f"{base}/readyz")
        assert ready.json() == {"status": "ready", "engine": "classic"}
        assert value(scrape(server), "swapcast_ready") == 1.0
        info = httpx.get(f"{base}/v1/server").json()
        assert info["ready"] is True and info["engine"] == "classic" and info["rtsp"]["available"] is False
        assert "SWAPCAST_RTSP_ENABLED" in info["rtsp"]["reason"]


def test_a_model_that_fails_to_load_leaves_the_server_alive_but_not_ready(identity_dir: Path) -> None:
    def broken(settings: PipelineSettings) -> FramePipeline:
        raise ModelError("retinaface_mnet025.onnx: sha256 mismatch")

    with start_server(server_settings(identity_dir), broken, wait_ready=False) as server:
        deadline_reason = ""
        for _ in range(100):
            reply = httpx.get(f"{server.base_url}/readyz")
            deadline_reason = reply.json()["reason"]
            if deadline_reason.startswith("model load failed"):
                break
            threading.Event().wait(0.05)
        assert reply.status_code == 503
        assert deadline_reason == "model load failed: retinaface_mnet025.onnx: sha256 mismatch"
        assert httpx.get(f"{server.base_url}/healthz").status_code == 200


@pytest.mark.slow
def test_metrics_follow_a_session(server: RunningServer, tom_png: bytes, clip: MotionClip) -> None:
    identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
    before = scrape(server)

    async def run() -> dict:
        client = RtcClient(clip.frames, fps=15)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            await client.connect(http, f"/v1/sessions?identity={identity}")
            assert await client.wait_frames(10, 90)
            during = await asyncio.get_running_loop().run_in_executor(None, scrape, server)
            assert (await http.delete(client.location or "")).status_code == 204
            await client.close()
        return during

    during = asyncio.run(run())
    after = scrape(server)

    assert value(during, "swapcast_sessions_active") == value(before, "swapcast_sessions_active") + 1
    assert value(after, "swapcast_sessions_active") == value(before, "swapcast_sessions_active")
    closed = "swapcast_sessions_closed_total"
    assert value(after, closed, reason="deleted") == value(before, closed, reason="deleted") + 1

    def grew(name: str, at_least: float, **labels: str) -> None:
        delta = value(after, name, **labels) - value(before, name, **labels)
        assert delta >= at_least, (name, labels, delta)

    grew("swapcast_frames_in_total", 10, kind="session")
    grew("swapcast_frames_out_total", 10, kind="session")
    grew("swapcast_frame_latency_seconds_count", 10, kind="session")
    for stage in ("track", "align", "swap", "paste"):
        grew("swapcast_stage_seconds_count", 10, stage=stage)
    # Live sessions detect every 3rd frame, in the background unless a frame needs its own detection
    # (app.pipeline.live): both kinds are counted, neither on every frame.
    detections = sum(
        value(after, "swapcast_stage_seconds_count", stage=s) - value(before, "swapcast_stage_seconds_count", stage=s)
        for s in ("detect", "detect_background")
    )
    assert detections >= 3, detections
    frames_in = value(after, "swapcast_frames_in_total", kind="session") - value(
        before, "swapcast_frames_in_total", kind="session"
    )
    frames_out = value(after, "swapcast_frames_out_total", kind="session") - value(
        before, "swapcast_frames_out_total", kind="session"
    )
    dropped = sum(
        value(after, "swapcast_frames_dropped_total", kind="session", reason=r)
        - value(before, "swapcast_frames_dropped_total", kind="session", reason=r)
        for r in ("superseded", "output_superseded", "error")
    )
    assert 0 <= frames_in - frames_out - dropped <= 3
    assert value(after, "swapcast_frames_dropped_total", kind="session", reason="error") == 0
    assert value(after, "swapcast_rtsp_clients") == 0
