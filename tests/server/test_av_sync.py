"""Audio in sync with the swapped video on the WebRTC return: a real aiortc client sends video with a white
flash every second and audio with a 1 kHz tone burst at the same instants; what comes back must keep them
together (the server delays the audio by the video's processing latency)."""

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from aiortc.mediastreams import MediaStreamTrack

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.av_clients import (
    Returned,
    SlowedFactory,
    flash_and_tone_sender,
    in_sync,
    offsets_ms,
    open_session,
    watch_audio,
    watch_video,
)
from tests.server.harness import RunningServer, server_settings, start_server, upload


async def stream(
    server: RunningServer, identity: str, phases: list[Callable[[], None]], seconds: float
) -> tuple[list[list[float]], list[float], dict[str, Any]]:
    """Stream `seconds` per phase (each phase starts by calling its function); the offsets of each phase and
    the audio delay the server applied at its end."""
    pc = flash_and_tone_sender()
    out = Returned()
    tasks: list[asyncio.Task[None]] = []

    @pc.on("track")
    def on_track(track: MediaStreamTrack) -> None:
        watch = watch_video if track.kind == "video" else watch_audio
        tasks.append(asyncio.ensure_future(watch(track, out)))

    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
        response = await open_session(http, pc, identity)
        assert "m=audio" in response.text
        location = response.headers["location"]
        per_phase = []
        delays = []
        for phase in phases:
            phase()
            seen = len(out.flashes)
            await asyncio.sleep(seconds)
            per_phase.append(offsets_ms(Returned(out.flashes[seen:], out.tones)))
            delays.append(float((await http.get(f"{location}/audio")).json()["delay_ms"]))
        audio = (await http.get(f"{location}/audio")).json()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await pc.close()
        await http.delete(location)
    return per_phase, delays, audio


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.usefixtures("steady_collector")
def test_audio_comes_back_in_sync_with_the_video_as_the_engine_slows_down(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    factory = SlowedFactory(pipeline_factory)
    with start_server(server_settings(tmp_path / "identities"), factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        phases, delays, audio = asyncio.run(stream(server, identity, [factory.extra(0.0), factory.extra(0.04)], 9.0))
    print(
        f"A/V offsets on the WebRTC return, ms (audio minus video), engine as is then 40 ms slower: {phases}; {audio}"
    )
    assert audio["frames_out"] > 100 and audio["dropped"] <= 5, audio
    # The slower engine's latency is what the audio waits for: the delay grows with the 40 ms slowdown
    # (measured against the first phase, so the machine's own speed does not matter).
    assert delays[1] - delays[0] >= 25.0, (delays, audio)
    for offsets in phases:
        steady = offsets[1:]  # the delay follows the video's median latency over its last 30 frames
        assert len(steady) >= 3, phases
        assert in_sync(float(np.median(steady))), phases
