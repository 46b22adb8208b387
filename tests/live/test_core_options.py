"""A live stream's own options: the face-lost policy set on one stream's core takes effect on its next frames,
whatever the server's default (the same clip and counting as tests/pipeline/test_face_lost.py)."""

import pytest

from app.bench.face_lost import FaceLostClip, count_revealed, face_lost_clip
from app.live.core import LiveCore
from app.media.clips import load_sample
from app.names import FaceLostPolicy
from app.observability import Metrics
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
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
