"""Fixtures for the server tests: loopback-only ICE, a shared classic-engine server, real face photos and a
real face clip."""

import gc
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from app.media.clips import MotionClip, load_sample, make_motion_clip
from app.media.peer import use_host_addresses
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.factory import build_pipeline
from app.pipeline.pipeline import FramePipeline
from app.pipeline.types import Image
from app.settings import BatchingSettings, PipelineSettings
from engines.store import ModelStore
from tests.server.harness import RunningServer, encode, face_crop, server_settings, start_server

CLIP_FRAMES = 45


@pytest.fixture(scope="session", autouse=True)
def no_user_keys(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Servers (and `serve` subprocesses) read an empty keys file of their own, never the user's."""
    previous = os.environ.get("SWAPCAST_KEYS_FILE")
    os.environ["SWAPCAST_KEYS_FILE"] = str(tmp_path_factory.mktemp("keys") / "keys.json")
    yield
    if previous is None:
        os.environ.pop("SWAPCAST_KEYS_FILE", None)
    else:
        os.environ["SWAPCAST_KEYS_FILE"] = previous


@pytest.fixture(scope="session", autouse=True)
def loopback_ice() -> None:
    """Media stays on 127.0.0.1: aioice offers only the loopback address."""
    use_host_addresses(["127.0.0.1"])


@pytest.fixture
def steady_collector() -> Iterator[None]:
    """For a test that times sound against picture with its server and clients in this process: what earlier
    tests left on the heap is collected, then set aside (`gc.freeze`) until the test ends, so that the
    collector's full passes over a long run's heap (hundreds of milliseconds, every thread stopped) do not land
    in the measurement."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


@pytest.fixture(scope="session")
def pipeline_factory(store: ModelStore) -> Callable[[PipelineSettings], FramePipeline]:
    def factory(settings: PipelineSettings) -> FramePipeline:
        # As the server builds it: model calls through the shared dynamic batchers.
        return build_pipeline(settings, store, batching=BatchingSettings())

    return factory


@pytest.fixture(scope="session")
def local_pipeline(pipeline_factory: Callable[[PipelineSettings], FramePipeline]) -> FramePipeline:
    """The same pipeline the server runs, for computing expected outputs in the test."""
    return pipeline_factory(PipelineSettings(engine="classic", threads=1))


@pytest.fixture(scope="session")
def server(
    tmp_path_factory: pytest.TempPathFactory, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> Iterator[RunningServer]:
    running = start_server(server_settings(tmp_path_factory.mktemp("identities")), pipeline_factory)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def tom_png() -> bytes:
    return encode(load_sample("tom_hanks"), ".png")


@pytest.fixture(scope="session")
def t1_jpeg() -> bytes:
    return encode(load_sample("t1"), ".jpg")


@pytest.fixture(scope="session")
def t1_face_jpeg(detector: RetinaFaceDetector, t1: Image) -> bytes:
    """One face cut out of the group photo."""
    (faces,) = detector.process([t1])
    largest = max(faces, key=lambda f: f.area)
    return encode(face_crop(t1, largest.box), ".jpg")


@pytest.fixture(scope="session")
def clip(detector: RetinaFaceDetector, astronaut: Image) -> MotionClip:
    """640x480 frames of a real face moving through a virtual camera."""
    (faces,) = detector.process([astronaut])
    box = max(faces, key=lambda f: f.area).box
    focus = (float(box[0] + box[2]) / 2, float(box[1] + box[3]) / 2)
    return make_motion_clip(astronaut, size=(640, 480), frames=CLIP_FRAMES, focus=focus, seed=1)


@pytest.fixture(scope="session")
def clip_faces(detector: RetinaFaceDetector, clip: MotionClip) -> list[np.ndarray]:
    """The face box in each clip frame."""
    found = detector.process(clip.frames)
    return [max(f, key=lambda x: x.area).box for f in found]


@pytest.fixture()
def identity_dir(tmp_path: Path) -> Path:
    return tmp_path / "identities"
