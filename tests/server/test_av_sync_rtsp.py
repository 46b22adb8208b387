"""Audio in the RTSP output, in sync with the video: a real aiortc client sends a flash every second and a tone
burst at the same instants; a PyAV client (what OBS's media source is built on) pulls the session's RTSP path
and compares, by presentation time, when each flash and each burst begin. The engine is then made 40 ms
slower: the offset must not move with it."""

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.egress.rtsp import rtsp_unavailable_reason
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.av_offset import pull_onsets
from tests.server.av_clients import SlowedFactory, drain, flash_and_tone_sender, in_sync, open_session
from tests.server.harness import server_settings, start_server, upload

UNAVAILABLE = rtsp_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")
PHASE_S = 8.0


async def pull_phases(base_url: str, identity: str, phases: list[Callable[[], None]]) -> tuple[list[list[float]], str]:
    pc = flash_and_tone_sender()
    tasks: list[asyncio.Task[None]] = []
    pc.on("track", lambda track: tasks.append(asyncio.ensure_future(drain(track))))
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        response = await open_session(http, pc, identity)
        url = response.headers["x-rtsp-url"]
        for _ in range(100):  # the path is published with the session's first swapped frame
            if (await http.get(response.headers["location"])).json()["frames_out"] > 0:
                break
            await asyncio.sleep(0.1)
        per_phase = []
        for phase in phases:
            phase()
            onsets = await asyncio.to_thread(pull_onsets, url, PHASE_S)
            per_phase.append(onsets.offsets_ms())
        audio = (await http.get(f"{response.headers['location']}/audio")).json()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pc.close()
        await http.delete(response.headers["location"])
    return per_phase, str(audio)


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.usefixtures("steady_collector")
def test_the_rtsp_output_carries_the_audio_in_sync_as_the_engine_slows_down(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    factory = SlowedFactory(pipeline_factory)
    settings = server_settings(tmp_path / "identities", rtsp_enabled=True, rtsp_port=0)
    with start_server(settings, factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        phases, audio = asyncio.run(pull_phases(server.base_url, identity, [factory.extra(0.0), factory.extra(0.04)]))
    print(f"A/V offsets on the RTSP pull, ms (audio minus video), engine as is then 40 ms slower: {phases}; {audio}")
    medians = []
    for offsets in phases:
        assert len(offsets) >= 4, phases  # both streams decoded, and the bursts found next to the flashes
        medians.append(float(np.median(offsets)))
    # The offset does not follow the engine's latency (a path that did would move by the whole 40 ms): the
    # audio waits for the video, whatever it takes.
    assert abs(medians[1] - medians[0]) <= 20.0, phases
    assert all(in_sync(m) for m in medians), phases
