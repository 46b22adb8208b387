"""WHEP viewers get the session's audio too, encoded once for all of them, in sync with the video: a real
aiortc client sends a flash every second and a tone burst at the same instants; two aiortc viewers pull the
session's output with audio and see the bursts next to the flashes."""

import asyncio
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamTrack

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.av_clients import (
    Returned,
    drain,
    flash_and_tone_sender,
    in_sync,
    offsets_ms,
    open_session,
    watch_audio,
    watch_video,
)
from tests.server.harness import server_settings, start_server, upload

SECONDS = 6.0


async def view(base_url: str, identity: str, viewers: int) -> tuple[list[Returned], dict[str, object]]:
    sender = flash_and_tone_sender()
    tasks: list[asyncio.Task[None]] = []
    sender.on("track", lambda track: tasks.append(asyncio.ensure_future(drain(track))))
    seen = [Returned() for _ in range(viewers)]
    pcs = []
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as http:
        response = await open_session(http, sender, identity)
        location = response.headers["location"]
        for out in seen:
            pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
            pc.addTransceiver("video", direction="recvonly")
            pc.addTransceiver("audio", direction="recvonly")

            def on_track(track: MediaStreamTrack, out: Returned = out) -> None:
                watch: Callable[..., object] = watch_video if track.kind == "video" else watch_audio
                tasks.append(asyncio.ensure_future(watch(track, out)))  # type: ignore[arg-type]

            pc.on("track", on_track)
            await pc.setLocalDescription(await pc.createOffer())
            answer = await http.post(
                f"{location}/whep", content=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"}
            )
            assert answer.status_code == 201, answer.text
            assert "m=audio" in answer.text and "opus/48000" in answer.text.lower()
            await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
            pcs.append(pc)
        await asyncio.sleep(SECONDS)
        listing = (await http.get(f"{location}/whep")).json()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for pc in [*pcs, sender]:
            await pc.close()
        await http.delete(location)
    return seen, listing


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.usefixtures("steady_collector")
def test_viewers_hear_the_session_in_sync_with_its_video(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], tom_png: bytes
) -> None:
    with start_server(server_settings(tmp_path / "identities"), pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        seen, listing = asyncio.run(view(server.base_url, identity, viewers=2))
    per_viewer = [offsets_ms(out) for out in seen]
    print(f"A/V offsets at two WHEP viewers, ms (audio minus video): {per_viewer}; {listing}")
    for viewer in listing["viewers"]:  # type: ignore[union-attr]
        assert viewer["audio_packets_sent"] > 100, listing
    for offsets in per_viewer:
        assert len(offsets) >= 3, per_viewer
        assert in_sync(float(np.median(offsets[1:]))), per_viewer
