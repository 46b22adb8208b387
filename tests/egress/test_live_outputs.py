"""A live core's outputs without a server (tests/egress/harness.py): a session publishing into a channel path,
whose one shared encode every reader takes the same packets of; an output that fails is dropped, not the worker;
the channel's feed fills a publisher's gap at its rate; nothing is encoded while nobody reads."""

from collections.abc import Iterator

import pytest

from app.egress.path import OutputPath
from app.live.channel_feed import ChannelFeed
from app.media.clips import make_motion_clip
from app.media.encoder import EncoderPolicy
from app.observability import Metrics
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.pipeline import FramePipeline, PipelineConfig
from app.pipeline.swap import ClassicEngine
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from app.settings import EncoderSettings
from engines.store import ModelStore
from tests.egress.harness import PacketReader, live_core, publish_into, run_frames
from tests.helpers import wait_for

FPS = 15
SIZE = (320, 240)


@pytest.fixture(scope="module")
def pipeline(store: ModelStore) -> FramePipeline:
    detector = RetinaFaceDetector(OnnxModel(store.ensure("retinaface_mnet025"), threads=1), DetectorConfig(size=320))
    return FramePipeline(detector, ClassicEngine(), config=PipelineConfig(live_detect_background=False))


@pytest.fixture(scope="module")
def frames(astronaut: Image) -> list[Image]:
    return make_motion_clip(astronaut, size=SIZE, frames=2 * FPS, fps=FPS).frames


@pytest.fixture
def path() -> Iterator[OutputPath]:
    feed = ChannelFeed("harness", *SIZE, FPS, hold_s=0.5)
    path = OutputPath(feed, EncoderPolicy(EncoderSettings()), metrics=Metrics())
    yield path
    path.close()


def test_every_reader_takes_the_same_packets_of_one_encode(
    pipeline: FramePipeline, frames: list[Image], path: OutputPath
) -> None:
    core = live_core(pipeline, Metrics())
    publish_into(core, path)
    rtsp, whep, push = PacketReader(), PacketReader(), PacketReader("aac")
    for reader in (rtsp, whep, push):
        path.encode.attach(reader)
    try:
        run_frames(core, frames, FPS)
        assert wait_for(lambda: len(push.video()) >= len(frames) // 2, 10)
    finally:
        for reader in (rtsp, whep, push):
            path.encode.detach(reader)
        core.close()
    # One encode for the three: the very same packets, from the first (a keyframe) on.
    first = rtsp.video()
    assert first[0].keyframe and len(first) <= path.encode.frames_encoded
    for other in (whep, push):
        shared = min(len(first), len(other.video()))
        assert shared >= len(frames) // 2
        assert all(a is b for a, b in zip(first[:shared], other.video()[:shared], strict=True))
    assert path.encode.runs == 1 and path.encode.reader_errors == 0


def test_an_output_that_raises_is_detached_and_the_others_go_on(pipeline: FramePipeline, frames: list[Image]) -> None:
    metrics = Metrics()
    core = live_core(pipeline, metrics)
    got: list[object] = []

    def broken(frame: object) -> None:
        raise RuntimeError("this output broke")

    core.output_listeners += [broken, got.append]
    try:
        run_frames(core, frames[:10], FPS)
    finally:
        core.close()
    assert len(got) == 10 and core.output_listeners == [got.append]
    assert core.stats()["output_errors"] == 1
    assert metrics.egress_reader_errors.labels("session")._value.get() == 1


def test_a_publishers_gap_is_filled_at_the_channels_rate_and_a_new_one_starts_on_a_keyframe(
    pipeline: FramePipeline, frames: list[Image]
) -> None:
    # Keyframes only when asked (none periodic within the test, none held back), so the one that starts the new
    # publisher is its own.
    settings = EncoderSettings(keyframe_min_interval_s=0.0, keyframe_interval_s=30.0)
    path = OutputPath(ChannelFeed("harness", *SIZE, FPS, hold_s=0.5), EncoderPolicy(settings))
    reader = PacketReader()
    path.encode.attach(reader)
    first, second = live_core(pipeline, Metrics(), name="first"), live_core(pipeline, Metrics(), name="second")
    try:
        key = publish_into(first, path)
        run_frames(first, frames[:FPS], FPS)
        path.feed.detach(key)
        published = len(reader.video())
        # Nobody publishes: the held frame, then the slate, at the channel's rate (the feed is the one clock).
        assert wait_for(lambda: path.feed.stats()["showing"] == "slate", 5)
        assert wait_for(lambda: len(reader.video()) >= published + FPS, 5)
        before = len(reader.video())
        publish_into(second, path)
        run_frames(second, frames[:5], FPS)
        assert wait_for(lambda: len(reader.video()) >= before + 5, 5)
    finally:
        path.encode.detach(reader)
        path.close()
        first.close()
        second.close()
    # The new publisher's first frame asked the encode for a keyframe: it came within a few frames.
    after = reader.video()[before:]
    assert any(p.keyframe for p in after[:4])


def test_nothing_is_encoded_while_nobody_reads(pipeline: FramePipeline, frames: list[Image], path: OutputPath) -> None:
    core = live_core(pipeline, Metrics())
    publish_into(core, path)
    try:
        run_frames(core, frames[:FPS], FPS)
    finally:
        core.close()
    assert path.feed.stats()["frames_published"] == FPS
    assert path.encode.frames_encoded == 0 and not path.encode.running
