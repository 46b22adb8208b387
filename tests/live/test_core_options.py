"""A live stream's own options: the face-lost policy set on one stream's core takes effect on its next frames,
whatever the server's default (the same clip and counting as tests/pipeline/test_face_lost.py); the mouth mask is
kept, or not, per stream by the one engine they share."""

import numpy as np
import pytest

from app.bench.face_lost import FaceLostClip, count_revealed, face_lost_clip
from app.live.core import LiveCore
from app.media.clips import load_sample
from app.names import FaceLostPolicy
from app.observability import Metrics
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.landmarks import FaceMeshLandmarker
from app.pipeline.mouth import MouthKeepingEngine
from app.pipeline.paste import PasteConfig
from app.pipeline.pipeline import FramePipeline, PipelineConfig
from app.pipeline.swap import ClassicEngine
from app.pipeline.timing import StageTimer
from app.pipeline.track import TrackerConfig
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


@pytest.fixture(scope="module")
def pipeline(store: ModelStore) -> FramePipeline:
    """The server's default is `pass`; detection inline on schedule, so that the run does not hang on timing."""
    detector = RetinaFaceDetector(
        OnnxModel(store.ensure("retinaface_mnet025"), threads=2), DetectorConfig(size=320, refine_landmarks=True)
    )
    config = PipelineConfig(
        tracker=TrackerConfig(detect_interval=3, on_face_lost="pass"),
        paste=PasteConfig(mask="ellipse"),
        live_detect_background=False,
    )
    return FramePipeline(detector, ClassicEngine(), config=config)


@pytest.fixture(scope="module")
def clip(pipeline: FramePipeline, astronaut: Image) -> FaceLostClip:
    (faces,) = pipeline.stages.detect.process([astronaut])
    return face_lost_clip(astronaut, faces[0], size=(320, 240), face_width=75.0)


def revealed(pipeline: FramePipeline, clip: FaceLostClip, policy: FaceLostPolicy | None) -> dict[str, object]:
    core = LiveCore(
        kind="session",
        name="options-test",
        identity_id="tom",
        source=pipeline.prepare_source(load_sample("tom_hanks")),
        pipeline=pipeline,
        metrics=Metrics(),
    )
    try:
        if policy is not None:
            core.set_face_lost(policy)
        assert core.stats()["options"]["on_face_lost"] == (policy or "pass")
        outputs = [core.process(frame, StageTimer()) for frame in clip.frames]
    finally:
        core.close()
    return count_revealed(clip, outputs)


@pytest.mark.slow
def test_a_streams_face_lost_policy_overrides_the_servers(pipeline: FramePipeline, clip: FaceLostClip) -> None:
    default = revealed(pipeline, clip, None)
    assert default["revealed_frames"] >= 1, default  # the server's `pass` shows the face: the test can fail
    for policy in ("cover", "hold"):
        counts = revealed(pipeline, clip, policy)
        assert counts["frames_showing_a_face"] >= 100, counts
        assert counts["revealed_frames"] == 0, (policy, counts)


def first_frame(pipeline: FramePipeline, image: Image, mouth_mask: bool | None) -> tuple[Image, dict[str, object]]:
    """A new stream's first output of `image`, with its mouth mask set (None: the server's setting)."""
    core = LiveCore(
        kind="session",
        name=f"mouth-{mouth_mask}",
        identity_id="tom",
        source=pipeline.prepare_source(load_sample("tom_hanks")),
        pipeline=pipeline,
        metrics=Metrics(),
    )
    try:
        if mouth_mask is not None:
            core.set_options(mouth_mask=mouth_mask)
        return core.process(image, StageTimer()), core.options()
    finally:
        core.close()


def test_each_stream_keeps_the_mouth_or_not_through_one_engine(
    pipeline: FramePipeline, store: ModelStore, astronaut: Image
) -> None:
    landmarker = FaceMeshLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=2))
    shared = FramePipeline(
        pipeline.detector, MouthKeepingEngine(ClassicEngine(), landmarker, 1.0), config=pipeline.config
    )
    try:
        default, default_options = first_frame(shared, astronaut, None)
        kept, _ = first_frame(shared, astronaut, True)
        swapped, options = first_frame(shared, astronaut, False)
    finally:
        shared.engine.close()  # the detector stays: it is the module's
    assert default_options["mouth_mask"] is True and options == {**default_options, "mouth_mask": False}
    assert np.array_equal(default, kept)
    (faces,) = pipeline.stages.detect.process([astronaut])
    x1, y1, x2, y2 = faces[0].box.astype(int)
    mouth = (slice(y1 + (y2 - y1) * 2 // 3, y2), slice(x1 + (x2 - x1) // 4, x2 - (x2 - x1) // 4))
    diff = np.abs(kept.astype(int) - swapped.astype(int))
    assert diff[mouth].mean() > 5  # the stream without the mask gets the engine's mouth
    # Above the mouth only paste-back's colour match moves (measured on the whole crop, mouth included), a little.
    assert diff[y1 : y1 + (y2 - y1) // 2].mean() < diff[mouth].mean() / 5
    assert diff[: max(0, y1 - 8)].max() == 0  # and outside the face nothing at all
