"""Draining a replica: readiness turns 503, new sessions and streams get 503 with Retry-After, the open
session keeps streaming until it ends (or the drain timeout passes), then the server stops."""

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.bench.rtc_client import RtcClient
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import ServeProcess
from tests.server.harness import server_settings, start_server, upload

# Draining is a state-changing request the operator sends by hand: it carries the non-simple header the
# cross-site protection asks for.
OPERATOR = {"X-Swapcast": "1"}


def metric(text: str, line_start: str) -> float:
    for line in text.splitlines():
        if line.startswith(line_start + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{line_start} not in /metrics")


@pytest.mark.slow
def test_drain_refuses_new_work_and_waits_for_the_open_session(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
) -> None:
    settings = server_settings(tmp_path / "identities", drain_timeout_s=60.0)
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        drained = threading.Event()
        server.app.state.drain.on_drained = drained.set
        before = httpx.get(f"{server.base_url}/metrics").text
        assert metric(before, "swapcast_session_capacity") == 2.0
        assert metric(before, "swapcast_draining") == 0.0

        async def run() -> None:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                client = RtcClient(clip.frames, fps=15)
                await client.connect(http, f"/v1/sessions?identity={identity}")
                assert await client.wait_frames(2, 60)

                proxied = await http.post("/v1/server/drain", headers={**OPERATOR, "X-Forwarded-For": "203.0.113.7"})
                assert proxied.status_code == 403
                started = await http.post("/v1/server/drain", headers=OPERATOR)
                assert started.status_code == 202, started.text
                assert started.json()["draining"] is True and started.json()["open"] == 1

                ready = await http.get("/readyz")
                assert ready.status_code == 503 and ready.json()["reason"] == "draining"
                refused = await http.post(
                    f"/v1/sessions?identity={identity}", content="v=0\r\n", headers={"Content-Type": "application/sdp"}
                )
                assert refused.status_code == 503 and refused.headers["Retry-After"] == "5"
                assert "draining" in refused.json()["detail"]
                stream = await http.post(
                    "/v1/streams", json={"source_url": "rtsp://127.0.0.1:1/x", "identity": identity}
                )
                assert stream.status_code == 503
                metrics = (await http.get("/metrics")).text
                assert metric(metrics, "swapcast_draining") == 1.0
                assert metric(metrics, "swapcast_session_capacity") == 0.0
                assert 'swapcast_admission_rejections_total{reason="draining",resource="session"} 1.0' in metrics

                # The open session keeps being served while draining.
                assert await client.wait_sent_after(time.monotonic(), 30)
                assert (await http.get(client.location or "")).status_code == 200
                assert not drained.is_set()
                assert (await http.delete(client.location or "")).status_code == 204
                await client.close()

        asyncio.run(run())
        assert drained.wait(5), "the drain did not finish after the last session ended"
        assert server.app.state.drain.status()["drained"] is True


@pytest.mark.slow
def test_prestop_drain_then_sigterm_keeps_the_session_until_the_drain_timeout(
    tmp_path: Path, model_root: Path, tom_png: bytes, clip: MotionClip
) -> None:
    serve = ServeProcess(
        "tests.deploy.loopback_serve",
        ["--port", "0", "--no-rtsp", "--identity-dir", str(tmp_path / "identities")],
        model_root,
        SWAPCAST_DRAIN_TIMEOUT_S="4",
        SWAPCAST_PUBLIC_BASE_URL="http://replica-1.example:8000",
    )
    proc = serve.proc
    try:
        base = serve.wait_ready().base_url
        identity = upload(base, tom_png, "tom.png").json()["id"]

        async def run() -> float:
            async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                client = RtcClient(clip.frames, fps=15)
                response = await client.connect(http, f"/v1/sessions?identity={identity}")
                assert client.location is not None
                assert client.location.startswith("http://replica-1.example:8000/v1/sessions/"), client.location
                path = "/v1/sessions/" + client.location.rsplit("/", 1)[1]
                assert response.status_code == 201
                assert await client.wait_frames(2, 60)

                # As Kubernetes stops a pod: the preStop hook asks for the drain, then SIGTERM comes.
                assert (await http.post("/v1/server/drain", headers=OPERATOR)).status_code == 202
                proc.send_signal(signal.SIGTERM)
                sent = time.monotonic()
                await asyncio.sleep(1.0)
                assert proc.poll() is None, "the server stopped at once instead of draining"
                assert (await http.get("/readyz")).status_code == 503
                assert (await http.get(path)).status_code == 200
                assert await client.wait_sent_after(time.monotonic(), 10), "the open session stopped while draining"
                await asyncio.get_running_loop().run_in_executor(None, proc.wait, 30)
                stopped_after = time.monotonic() - sent
                await client.close()
                return stopped_after

        stopped_after = asyncio.run(run())
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    assert proc.returncode == 0, proc.stderr.read() if proc.stderr else ""
    # The session stayed open, so the 4 s drain timeout ended it, then shutdown took its grace at most.
    assert 3.5 <= stopped_after <= 15, stopped_after
