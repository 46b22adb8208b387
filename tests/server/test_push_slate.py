"""A push delivers at the channel's rate even when little changes on screen: on the "be right back" slate every
packet is a few bytes, and the push's pipe to its muxer's process must pass each one on as it comes, not once
a buffer fills (an RTMP read-back of the slate went 1.96 s without a frame when it did)."""

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.harness import LOOPBACK_DESTINATIONS, server_settings, start_server
from tests.server.push_servers import NginxRtmp, Reader, nginx_unavailable
from tests.server.test_push_delivery import SIZE, add_push, make_channel, push_stats

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(nginx_unavailable() is not None, reason=f"no RTMP server: {nginx_unavailable()}"),
]
GAP_MAX_S = 0.5
WATCH_S = 6.0


def test_an_rtmp_push_of_the_slate_arrives_frame_by_frame_not_in_bursts(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    settings = server_settings(tmp_path / "identities", push_retry_s=0.2, push_retry_max_s=1.0, **LOOPBACK_DESTINATIONS)
    with NginxRtmp(tmp_path / "nginx") as nginx, start_server(settings, pipeline_factory) as server:
        make_channel(server, "quiet")  # nobody publishes: the channel shows its slate
        push = add_push(server, "quiet", {"url": nginx.url("slate")})
        assert wait_for(lambda: push_stats(server, "quiet", push["id"])["state"] == "live", 30)
        reader = Reader(nginx.url("slate"))
        try:
            assert wait_for(lambda: len(reader.seen.frames) > 0, 60), reader.seen.errors
            start = reader.seen.frames[0][0] + 1.0  # past the player's start
            time.sleep(1.0 + WATCH_S)
        finally:
            reader.stop()
        gap = reader.seen.longest_gap(start, start + WATCH_S)
        count = len([t for t, _ in reader.seen.frames if start <= t <= start + WATCH_S])
        print(f"slate over RTMP: {count} frames in {WATCH_S} s, longest gap {gap:.3f} s")
        assert count >= WATCH_S * SIZE["fps"] * 0.8, count
        assert gap < GAP_MAX_S, f"the slate came in bursts: {gap:.2f} s without a frame"
