"""The pipeline through shared batchers: a frame's result does not depend on what it was batched with."""

import threading

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from app.media.clips import make_motion_clip
from app.pipeline.batching import BatchedStage, BatchSettings
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.paste import PasteConfig
from app.pipeline.pipeline import FramePipeline, PipelineConfig, Stages
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.swap import InswapperEngine, SwapItem
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


def load_parts(store: ModelStore) -> tuple[RetinaFaceDetector, InswapperEngine]:
    detector = RetinaFaceDetector(OnnxModel(store.ensure("retinaface_mnet025"), threads=1), DetectorConfig())
    recognizer = ArcFaceRecognizer(OnnxModel(store.ensure("reference_recognizer"), threads=1))
    engine = InswapperEngine(OnnxModel(store.ensure("reference_swapper_narrow"), threads=1), recognizer)
    return detector, engine


@pytest.fixture(scope="module")
def parts(store: ModelStore) -> tuple[RetinaFaceDetector, InswapperEngine]:
    return load_parts(store)


def test_engine_batch_equals_single(parts: tuple[RetinaFaceDetector, InswapperEngine], t1: Image) -> None:
    detector, engine = parts
    (faces,) = detector.process([t1])
    source = engine.prepare(t1, faces[0])
    from app.pipeline.align import align_faces

    crops = [a.crop for a in align_faces([t1], [faces], engine.align)]
    batched = engine.process([SwapItem(c, source) for c in crops])
    alone = [engine.process([SwapItem(c, source)])[0] for c in crops]
    for a, b in zip(batched, alone, strict=True):
        assert np.array_equal(a, b)


def test_frames_batched_across_sessions_equal_frames_run_alone(store: ModelStore, astronaut: Image, t1: Image) -> None:
    detector, engine = load_parts(store)  # its own models: closing the pipeline closes them
    config = PipelineConfig(paste=PasteConfig(mask="box"))
    registry = CollectorRegistry()
    live_detector = RetinaFaceDetector(detector.model, DetectorConfig(canvas="fixed"))
    stages = Stages(
        detect=BatchedStage(live_detector, BatchSettings(max_batch=4, max_delay_ms=50, deadline_ms=None), registry),
        swap=BatchedStage(engine, BatchSettings(max_delay_ms=50, deadline_ms=None), registry, name="swap"),
    )
    shared = FramePipeline(detector, engine, config=config, stages=stages)
    source = shared.prepare_source(astronaut)
    clip = make_motion_clip(astronaut, size=(480, 360), frames=4, seed=5)
    frames = [*clip.frames, t1[:600, :800].copy()]
    try:
        alone = [shared.process([f], source, session="solo")[0].image for f in frames]
        together: list[Image | None] = [None] * len(frames)

        def run(i: int) -> None:
            together[i] = shared.process([frames[i]], source, session=f"s{i}")[0].image

        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(frames))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for a, b in zip(alone, together, strict=True):
            assert b is not None and np.array_equal(a, b)
        batch_sizes = registry.get_sample_value("swapcast_batcher_batch_size_sum", {"batcher": "detect"})
        batches = registry.get_sample_value("swapcast_batcher_batch_size_count", {"batcher": "detect"})
        assert batch_sizes is not None and batches is not None
        assert batch_sizes / batches > 1.0, "concurrent sessions should have shared detector batches"
    finally:
        shared.close()


def test_live_frames_are_detected_at_the_live_size_and_photos_at_the_full_size(store: ModelStore, t1: Image) -> None:
    """The server's shared detector (live sessions and streams) takes SWAPCAST_LIVE_DETECT_SIZE, 320 by
    default: a camera's face is large; identity photos keep SWAPCAST_DETECT_SIZE (640)."""
    from app.pipeline.factory import build_pipeline
    from app.settings import BatchingSettings, PipelineSettings

    pipeline = build_pipeline(PipelineSettings(engine="passthrough", threads=1), store, batching=BatchingSettings())
    try:
        live = pipeline.stages.detect
        assert isinstance(live, BatchedStage) and isinstance(live.stage, RetinaFaceDetector)
        assert (live.stage.config.size, live.stage.config.canvas) == (320, "fixed")
        assert (pipeline.detector.config.size, pipeline.detector.config.canvas) == (640, "tight")
        (found,) = live.process([t1])
        (photo,) = pipeline.detector.process([t1])
        assert len(found) == len(photo) >= 1
    finally:
        pipeline.close()
    settings = PipelineSettings(engine="passthrough", threads=1, live_detect_size=384)
    pipeline = build_pipeline(settings, store, batching=BatchingSettings())
    try:
        assert pipeline.stages.detect.stage.config.size == 384  # type: ignore[attr-defined]
    finally:
        pipeline.close()
    # Without batching (the server's default on a CPU) the server's frames take the live size too; files do not.
    from app.server.state import shared_pipeline_factory

    server = shared_pipeline_factory(store, None, CollectorRegistry())(
        PipelineSettings(engine="passthrough", threads=1)
    )
    files = build_pipeline(PipelineSettings(engine="passthrough", threads=1), store)
    try:
        assert isinstance(server.stages.detect, RetinaFaceDetector) and server.stages.detect.config.size == 320
        assert server.detector.config.size == 640
        assert isinstance(files.stages.detect, RetinaFaceDetector) and files.stages.detect.config.size == 640
        (found,) = server.stages.detect.process([t1])
        assert len(found) >= 1
    finally:
        server.close()
        files.close()
