"""Triton killed mid-session and started again: while the model tier is away the session goes on with its
faces covered (never shown unswapped), `/readyz` answers 503 with the reason, and once Triton is back the
session swaps again by itself and the server is ready again. Runs where the Triton test server is installed
(scripts/setup-triton.sh), skipped elsewhere."""

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from app.bench.rtc_client import RtcClient
from app.cli import main
from app.media.clips import MotionClip
from app.pipeline.cover import pixelate
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Face, Image
from app.settings import PipelineSettings
from engines.store import ModelStore
from tests.deploy.triton_server import TritonServer, triton_venv
from tests.server.harness import server_settings, start_server, upload
from tests.server.test_sessions import face_diff

MODELS = ("reference_recognizer", "reference_swapper_narrow")
NOISE = 20.0  # mean absolute difference in the middle of the face box above which two faces differ
COVERED = "swapcast_frames_covered_for_model_errors_total"
pytestmark = pytest.mark.slow


@pytest.fixture()
def repository(store: ModelStore, tmp_path: Path) -> Iterator[Path]:
    triton_venv()
    for name in (*MODELS, "retinaface_mnet025"):
        store.ensure(name)
    repository = tmp_path / "repository"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SWAPCAST_BATCH_DEADLINE_MS", "5000")  # as test_triton_backend: 2 busy cores
        code = main(["triton", "export", "--out", str(repository), "--platform", "python", "--models", *MODELS])
    assert code == 0
    yield repository


def look(image: Image, sent: Image, box: np.ndarray) -> str:
    """How the face came back: `covered` (within the codec's noise of its pixelated self: ~11 measured),
    `swapped` (far from what was sent: ~61 measured, and not covered) or `shown` (as it was sent)."""
    hidden = pixelate(sent, [Face(box, 1.0, np.zeros((5, 2), np.float32))])
    if face_diff(image, hidden, box) < NOISE:
        return "covered"
    return "swapped" if face_diff(image, sent, box) > NOISE else "shown"


def test_triton_killed_and_restarted_mid_session(
    repository: Path,
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    detector: RetinaFaceDetector,
    clip: MotionClip,
    tom_png: bytes,
) -> None:
    still = clip.frames[0]
    (faces,) = detector.process([still])
    box = max(faces, key=lambda f: f.area).box
    triton = TritonServer(repository, tmp_path).wait_ready()
    pipeline = PipelineSettings(
        engine="inswapper",
        swapper_model="reference_swapper_narrow",
        recognizer_model="reference_recognizer",
        backend="triton",
        triton_url=triton.url,
        threads=1,
    )
    try:
        with start_server(server_settings(tmp_path / "identities", pipeline=pipeline), pipeline_factory) as server:
            base = server.base_url
            identity = upload(base, tom_png).json()["id"]

            async def run() -> dict[str, list[str]]:
                nonlocal triton
                looks: dict[str, list[str]] = {"before": [], "away": [], "back": []}
                client = RtcClient([still] * 3000, fps=10, keep_images=True)
                async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                    await client.connect(http, f"/v1/sessions?identity={identity}")

                    async def watch(phase: str, count: int) -> None:
                        start = len(client.result.received)
                        assert await client.wait_frames(start + count, 60), f"{phase}: the session stalled"
                        looks[phase] += [
                            look(r.image, still, box) for r in client.result.received[start:] if r.image is not None
                        ]

                    await watch("before", 10)
                    triton.proc.kill()
                    await asyncio.to_thread(triton.proc.wait, 10)
                    await asyncio.sleep(1.0)
                    ready = await http.get("/readyz")
                    assert ready.status_code == 503, ready.text
                    assert ready.json()["reason"].startswith(f"the model tier is away: Triton at {triton.url}")
                    await watch("away", 10)
                    metrics = (await http.get("/metrics")).text
                    line = next(x for x in metrics.splitlines() if x.startswith(f"{COVERED} "))
                    assert float(line.split()[1]) >= 10, line

                    # Started off the event loop: the client keeps sending (and answering ICE) meanwhile.
                    triton = TritonServer(repository, tmp_path, ports=triton.ports)
                    await asyncio.to_thread(triton.wait_ready)
                    deadline = time.monotonic() + 30
                    while (await http.get("/readyz")).status_code != 200:
                        assert time.monotonic() < deadline, "not ready again within 30 s of Triton's return"
                        await asyncio.sleep(0.2)
                    while True:  # swapping again by itself
                        await watch("back", 1)
                        if looks["back"][-3:] == ["swapped"] * 3:
                            break
                        assert time.monotonic() < deadline, looks
                    await http.delete(client.location or "")
                    await client.close()
                return looks

            looks = asyncio.run(run())
    finally:
        triton.stop()
    assert "shown" not in looks["before"] + looks["away"] + looks["back"], looks
    assert looks["before"][-3:] == ["swapped"] * 3, looks
    assert set(looks["away"]) == {"covered"}, looks
