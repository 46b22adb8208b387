"""What one key can make the server do is bounded server-wide: channels no larger or faster than the server's
most (422 with the reason), no more channels than its most, all owners together (409), and no more pushes
running than its most (503 when one is added beyond it; stored ones beyond it, at start, wait their turn,
"queued", rather than each running a child process)."""

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.harness import LOOPBACK_DESTINATIONS, RunningServer, server_settings, start_server
from tests.server.push_servers import free_port


def post(server: RunningServer, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.base_url}{path}", json=body, headers={"X-Swapcast": "1"}, timeout=30)


def states(server: RunningServer, channel: str) -> list[str]:
    answer = httpx.get(f"{server.base_url}/v1/channels/{channel}/pushes", timeout=30)
    return [p["state"] for p in answer.json()["pushes"]]


def test_channels_are_bounded_in_size_rate_and_number_and_pushes_in_number(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline], caplog: pytest.LogCaptureFixture
) -> None:
    bounds = {"max_channels": 2, "max_channel_fps": 30, "push_retry_s": 0.2, "push_retry_max_s": 0.4}
    settings = server_settings(tmp_path / "identities", max_push_workers=2, **bounds, **LOOPBACK_DESTINATIONS)
    nowhere = f"rtmp://127.0.0.1:{free_port()}/live/key"  # nothing listens: the pushes retry
    with start_server(settings, pipeline_factory) as server:
        too_big = post(server, "/v1/channels", {"name": "big", "width": 3840, "height": 2160})
        assert too_big.status_code == 422 and "2073600 pixels" in too_big.json()["detail"], too_big.text
        too_fast = post(server, "/v1/channels", {"name": "fast", "width": 640, "height": 360, "fps": 60})
        assert too_fast.status_code == 422 and "30 fps" in too_fast.json()["detail"], too_fast.text
        # The most pixels in either shape: a phone's upright 1080x1920 is as large as 1920x1080.
        upright = post(server, "/v1/channels", {"name": "upright", "width": 1080, "height": 1920, "fps": 30})
        assert upright.status_code == 201, upright.text
        assert post(server, "/v1/channels", {"name": "second", "width": 320, "height": 240}).status_code == 201
        third = post(server, "/v1/channels", {"name": "third", "width": 320, "height": 240})
        assert third.status_code == 409 and "the server has 2 channels" in third.json()["detail"], third.text

        for _ in range(2):
            assert post(server, "/v1/channels/second/pushes", {"url": nowhere}).status_code == 201
        refused = post(server, "/v1/channels/upright/pushes", {"url": nowhere})
        assert refused.status_code == 503 and "runs 2 pushes" in refused.json()["detail"], refused.text
        assert "upright" not in (tmp_path / "channels" / "pushes.json").read_text()

    # Back with room for one push at a time: the stored two take turns, the other one queued meanwhile.
    settings = server_settings(tmp_path / "identities", max_push_workers=1, **bounds, **LOOPBACK_DESTINATIONS)
    with start_server(settings, pipeline_factory) as server:
        assert "waits its turn" in caplog.text
        assert wait_for(lambda: "queued" in states(server, "second"), 10), states(server, "second")
        seen: set[tuple[str, ...]] = set()
        wait_for(lambda: bool(seen.add(tuple(states(server, "second")))) or len(seen) > 20, 5)
        assert all(pair.count("connecting") <= 1 for pair in seen), seen  # never both at once
        assert post(server, "/v1/channels/upright/pushes", {"url": nowhere}).status_code == 503
