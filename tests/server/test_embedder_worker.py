"""The dlib worker process (identity maps' face embedder) killed with SIGKILL while a session maps faces: the
session goes on, the worker is started again (counted, and logged with how it ended), and faces whose identity
is not known yet stay covered until it is, never shown as themselves or swapped into the wrong person."""

import asyncio
import logging
import multiprocessing
import os
import signal
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.bench.rtc_client import RtcClient
from app.pipeline.types import Image
from tests.helpers import wait_for
from tests.server.harness import server_settings, start_server

# group_frame, group_boxes, reference_photos: the fixtures of test_identity_maps
from tests.server.test_identity_maps import (  # noqa: F401
    Factory,
    changed_faces,
    covered,
    group_boxes,
    group_frame,
    ids,
    reference_photos,
    settled,
)

MAPPED = [True, False, False, False]  # only the first person of the group is swapped


async def frames_until(client: RtcClient, done: Callable[[], bool], within_s: float = 90) -> None:
    while not done():
        more = len(client.result.received) + 1
        assert await client.wait_frames(more, within_s), f"only {more - 1} frames came back"


def images(client: RtcClient, start: int = 0) -> list[Image]:
    return [r.image for r in client.result.received[start:] if r.image is not None]


@pytest.mark.slow
def test_a_killed_dlib_worker_is_started_again_and_pending_faces_stay_covered(
    tmp_path: Path,
    pipeline_factory: Factory,
    tom_png: bytes,
    group_frame: Image,  # noqa: F811
    group_boxes: list[np.ndarray],  # noqa: F811
    reference_photos: list[bytes],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    settings = server_settings(tmp_path / "identities")
    with caplog.at_level(logging.WARNING), start_server(settings, pipeline_factory) as server:
        made = ids(server, {"tom": tom_png, "first": reference_photos[0]})
        query = f"/v1/sessions?map={made['first']}:{made['tom']}"

        async def run() -> tuple[RtcClient, RtcClient, int]:
            first, second = (RtcClient([group_frame] * 300, fps=15, keep_images=True) for _ in range(2))
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
                await first.connect(http, query)
                await frames_until(first, lambda: len(settled(images(first), group_frame, group_boxes)) >= 3)

                (worker,) = multiprocessing.active_children()  # the embedder's worker (the server runs in here)
                os.kill(worker.pid or 0, signal.SIGKILL)
                assert wait_for(lambda: not worker.is_alive(), 10)
                killed_at = len(first.result.received)

                await second.connect(http, query)  # four new faces to embed: the first job meets the dead worker
                await frames_until(second, lambda: len(settled(images(second), group_frame, group_boxes)) >= 5)
                await frames_until(first, lambda: len(first.result.received) >= killed_at + 10)
                for client in (first, second):
                    assert (await http.delete(client.location or "")).status_code == 204
                    await client.close()
            return first, second, killed_at

        first, second, killed_at = asyncio.run(run())

        # The first session went on through the kill, its faces as they were.
        after_kill = [changed_faces(image, group_frame, group_boxes) for image in images(first, killed_at)]
        assert len(after_kill) >= 10 and all(v == MAPPED for v in after_kill), after_kill
        # The second session's faces: every face covered until their identity was known, then only the mapped
        # person swapped (`settled` starts at the first frame not wholly covered).
        seen = images(second)
        assert covered(seen[0], group_frame, group_boxes)
        verdicts = settled(seen, group_frame, group_boxes)
        assert len(verdicts) >= 5 and all(v == MAPPED for v in verdicts), verdicts

        metrics = httpx.get(f"{server.base_url}/metrics").text
        assert 'swapcast_worker_restarts_total{worker="dlib_embedder"} 1.0' in metrics
        assert "the dlib worker process was killed by SIGKILL: starting it again" in caplog.text
        assert len(multiprocessing.active_children()) == 1  # the new worker, the dead one reaped
