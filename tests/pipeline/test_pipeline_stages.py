"""The pipeline's stages: any stage can be shared through a batcher by wrapping it, batching leaves
still-photo detection as it is, and closing a pipeline releases its batchers and its models."""

from __future__ import annotations

import threading

import cv2
import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from app.errors import ModelError
from app.pipeline.batching import BatchedStage, BatchSettings
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.factory import build_pipeline
from app.pipeline.paste import PasteConfig
from app.pipeline.pipeline import FramePipeline, PipelineConfig, Stages
from app.pipeline.stage import DEFAULT_SESSION, Stage
from app.pipeline.swap import PassthroughEngine
from app.pipeline.types import Image
from app.runtime.batcher import BatcherClosedError
from app.settings import BatchingSettings, PipelineSettings
from engines.store import ModelStore


def settings() -> PipelineSettings:
    return PipelineSettings(engine="classic", enhancer_model=None, backend="onnxruntime", precision="fp32", threads=1)


class Sharpen:
    """A crop stage of the kind a face parser or a second enhancer would be: unsharp masking, per crop."""

    name = "sharpen"

    def __init__(self) -> None:
        self.batch_sizes: list[int] = []
        self.closed = False

    def process(self, batch: list[Image], *, session: str = DEFAULT_SESSION) -> list[Image]:
        self.batch_sizes.append(len(batch))
        out = []
        for crop in batch:
            blurred = cv2.GaussianBlur(crop, (0, 0), 2.0)
            out.append(cv2.addWeighted(crop, 1.5, blurred, -0.5, 0))
        return out

    def close(self) -> None:
        self.closed = True


def test_a_new_stage_is_batched_by_wrapping_it(detector: RetinaFaceDetector, astronaut: Image, t1: Image) -> None:
    sharpen: Stage[Image, Image] = Sharpen()
    config = PipelineConfig(paste=PasteConfig(mask="box"))
    direct = FramePipeline(detector, PassthroughEngine(), [Sharpen()], config)
    registry = CollectorRegistry()
    wrapped = BatchedStage(sharpen, BatchSettings(max_batch=16, max_delay_ms=3000, deadline_ms=None), registry)
    shared = FramePipeline(
        detector, PassthroughEngine(), config=config, stages=Stages(detector, PassthroughEngine(), [wrapped])
    )
    source = direct.prepare_source(astronaut)
    frames = [astronaut, t1, astronaut[::-1].copy(), t1[:, ::-1].copy()]
    expected = [direct.process([f], source)[0] for f in frames]
    got: list[Image | None] = [None] * len(frames)
    for i in range(len(frames)):  # every session is known to be active: the batcher waits for them all
        wrapped.batcher.submit_many([], session=f"s{i}")

    def run(i: int) -> None:
        got[i] = shared.process([frames[i]], source, session=f"s{i}")[0].image

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(frames))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(expected, got, strict=True):
        assert b is not None and np.array_equal(a.image, b)
    stats = wrapped.batcher.stats()
    assert stats.completed == sum(len(r.faces) for r in expected)
    assert stats.batches < stats.completed, "sessions should have shared the new stage's batches"
    assert registry.get_sample_value("swapcast_batcher_completed_total", {"batcher": "sharpen"}) == stats.completed
    wrapped.close()
    assert isinstance(sharpen, Sharpen) and sharpen.closed
    assert wrapped.batcher.closed


def test_batching_leaves_still_photo_detection_as_unbatched(store: ModelStore, t1: Image) -> None:
    unbatched = build_pipeline(settings(), store)
    batched = build_pipeline(settings(), store, batching=BatchingSettings(), registry=CollectorRegistry())
    try:
        assert unbatched.detector.config == batched.detector.config
        assert batched.detector.config.canvas == "tight"
        live = batched.stages.detect
        assert isinstance(live, BatchedStage) and isinstance(live.stage, RetinaFaceDetector)
        assert live.stage.config.canvas == "fixed"
        wide = t1[:400].copy()  # a wide photo: the tight canvas differs from the shared 4:3 one
        (want,) = unbatched.detector.process([wide])
        batched.stages.detect.process([wide])  # live traffic through the batcher first changes nothing
        (got,) = batched.detector.process([wide])
        assert len(want) == len(got) > 0
        for a, b in zip(want, got, strict=True):
            assert np.array_equal(a.box, b.box) and np.array_equal(a.landmarks, b.landmarks)
    finally:
        unbatched.close()
        batched.close()


@pytest.mark.parametrize("batching", [None, BatchingSettings()], ids=["direct", "batched"])
def test_closing_a_pipeline_closes_its_batchers_and_models(
    store: ModelStore, astronaut: Image, batching: BatchingSettings | None
) -> None:
    pipeline = build_pipeline(settings(), store, batching=batching, registry=CollectorRegistry())
    source = pipeline.prepare_source(astronaut)
    pipeline.process([astronaut], source)
    model = pipeline.detector.model
    pipeline.close()
    pipeline.close()  # idempotent
    with pytest.raises(ModelError, match="is closed"):
        model.run({model.input_names[0]: np.zeros((1, 3, 64, 64), np.float32)})
    if batching is not None:
        live = pipeline.stages.detect
        assert isinstance(live, BatchedStage) and live.batcher.closed
        with pytest.raises(BatcherClosedError):
            live.process([astronaut])


def test_the_classic_engine_matches_colours_from_thumbnails_within_a_few_grey_levels(
    detector: RetinaFaceDetector, t1: Image
) -> None:
    """The classic engine takes both faces' colour statistics from 64×64 thumbnails (a tenth of the time at
    its 256 px crops) and moves colours in 8-bit LAB: its output stays within a few grey levels of float LAB
    with statistics taken on every pixel."""
    from app.media.clips import load_sample
    from app.pipeline.align import estimate_matrix, warp_crop
    from app.pipeline.color import MIN_SPREAD, STATS_SIZE, lab_stats, thumbnail_stats, transfer_color
    from app.pipeline.swap import ClassicEngine, SwapItem

    engine = ClassicEngine()
    source_photo = load_sample("tom_hanks")
    (source_faces,) = detector.process([source_photo])
    prepared = engine.prepare(source_photo, source_faces[0])
    (faces,) = detector.process([t1])
    crop = warp_crop(t1, estimate_matrix(faces[0].landmarks, engine.align), engine.align.size)
    assert crop.shape[0] > STATS_SIZE
    for image in (crop, prepared.data):
        (mean, std), (small_mean, small_std) = lab_stats(image), thumbnail_stats(image)
        assert np.abs(mean - small_mean).max() < 0.5 and np.abs(std - small_std).max() < 1.5
    (swapped,) = engine.process([SwapItem(crop, prepared, None)])
    # The source photo is grey: its chroma spreads are under MIN_SPREAD, so they are kept, not stretched.
    (source_mean, source_std), (target_mean, target_std) = lab_stats(prepared.data), lab_stats(crop)
    assert source_std[1] < MIN_SPREAD and source_std[2] < MIN_SPREAD
    kept = np.where(source_std < MIN_SPREAD, source_std, target_std)
    exact = np.rint(transfer_color(prepared.data, (source_mean, source_std), (target_mean, kept))).astype(np.int16)
    difference = np.abs(swapped.astype(np.int16) - exact)
    assert np.percentile(difference, 99.9) <= 3 and difference.mean() < 0.75
