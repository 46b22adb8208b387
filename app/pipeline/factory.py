"""Builds a FramePipeline from settings and the model store, checking every model once at load time."""

import logging
from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from app.errors import ModelError
from app.pipeline.batching import BatchedStage, BatchSettings
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.enhance import EnhanceConfig, RealEsrganEnhancer
from app.pipeline.paste import PasteConfig
from app.pipeline.pipeline import FramePipeline, PipelineConfig, Stages
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.stage import In, Out, Stage
from app.pipeline.swap import ClassicEngine, InswapperEngine, PassthroughEngine, SwapEngine, last_initializer
from app.pipeline.track import TrackerConfig
from app.pipeline.types import Image
from app.runtime.backend import load_backend
from app.runtime.model import Model
from app.settings import BatchingSettings, PipelineSettings
from engines.onnx_batch import make_batch_dynamic
from engines.registry import get_entry
from engines.store import ModelStore

log = logging.getLogger(__name__)


def load_model(store: ModelStore, name: str, settings: PipelineSettings) -> Model:
    path = store.ensure(name)
    return _load(path, settings, source=path, source_sha256=store.expected(name)[0])


def _load(path: Path, settings: PipelineSettings, *, source: Path, source_sha256: str | None) -> Model:
    """The backend and precision variant that settings.backend/precision pick (app.runtime.backend)."""
    return load_backend(
        path, settings.backend, settings.threads, settings.precision, source=source, source_sha256=source_sha256
    )


def dynamic_path(store: ModelStore, name: str) -> Path:
    """Where the batch-dynamic rewrite of a fixed-batch model is cached, beside the model."""
    original = store.file_path(name)
    sha256, _ = store.expected(name)
    return original.with_name(f"{original.stem}.{(sha256 or 'local')[:12]}.dynamic.onnx")


def load_batchable(store: ModelStore, name: str, settings: PipelineSettings) -> Model:
    """The model with a dynamic batch dimension. Graphs saved with a fixed batch of 1 (the real inswapper)
    are rewritten once, verified item by item against the original, and cached beside it; a graph that
    cannot be rewritten runs item by item, and the log says so once."""
    model = load_model(store, name, settings)
    original = store.ensure(name)
    if not model.fixed_batch or model.path != original:  # variants and engines are made batch-dynamic
        return model
    sha256, _ = store.expected(name)
    dynamic = dynamic_path(store, name)
    if not dynamic.is_file():
        try:
            make_batch_dynamic(original, dynamic)
        except ModelError as exc:
            log.warning("%s keeps its fixed batch of 1 (%s): faces run one by one", name, exc)
            return model
    model.close()
    return _load(dynamic, settings, source=original, source_sha256=sha256)


def build_engine(settings: PipelineSettings, store: ModelStore) -> SwapEngine:
    if settings.engine == "classic":
        return ClassicEngine()
    if settings.engine == "passthrough":
        return PassthroughEngine()
    recognizer = ArcFaceRecognizer(load_model(store, settings.recognizer_model, settings))
    swapper = load_batchable(store, settings.swapper_model, settings)
    original = store.ensure(settings.swapper_model)
    # FP32 graphs keep emap as their last initializer; variants and engines take it from their source.
    fp32 = swapper.path == original or swapper.path.name.endswith(".dynamic.onnx")
    return InswapperEngine(swapper, recognizer, emap=None if fp32 else last_initializer(original))


def build_pipeline(
    settings: PipelineSettings,
    store: ModelStore | None = None,
    *,
    batching: BatchingSettings | None = None,
    registry: CollectorRegistry | None = None,
) -> FramePipeline:
    """The pipeline for `settings`. With `batching`, every model stage goes through one shared dynamic
    batcher per stage (live serving); without, models are called directly (files, benchmarks)."""
    store = store or ModelStore()
    detect_config = DetectorConfig(
        size=settings.detect_size,
        score_threshold=settings.detect_threshold,
        refine_landmarks=settings.refine_landmarks,
    )
    detector = RetinaFaceDetector(load_model(store, settings.detector_model, settings), detect_config)
    engine = build_engine(settings, store)
    crops: list[Stage[Image, Image]] = []
    if settings.enhancer_model:
        scale = get_entry(settings.enhancer_model).scale or 1
        crops.append(
            RealEsrganEnhancer(
                load_model(store, settings.enhancer_model, settings), scale, EnhanceConfig(blend=settings.enhance_blend)
            )
        )
    # The classic engine's texture includes hair and background, so only the face proper is pasted.
    mask = settings.mask if settings.mask != "auto" else ("ellipse" if engine.name == "classic" else "box")
    config = PipelineConfig(
        faces=settings.faces,
        tracker=replace(TrackerConfig(), detect_interval=settings.detect_interval),
        paste=PasteConfig(mask=mask, color_strength=settings.color_strength),
    )
    if batching is None:
        return FramePipeline(detector, engine, crops, config)

    def batched(stage: Stage[In, Out], max_batch: int, name: str | None = None) -> BatchedStage[In, Out]:
        return BatchedStage(stage, BatchSettings.from_settings(batching, max_batch), registry, name=name)

    # Shared detection letterboxes every frame onto one canvas, so frames of any size share a batch and a
    # frame's result does not depend on its batch-mates; stills (identity uploads) keep the tight canvas.
    live_detector = RetinaFaceDetector(detector.model, replace(detect_config, canvas="fixed"))
    stages = Stages(
        detect=batched(live_detector, batching.detect_max_batch),
        swap=batched(engine, batching.swap_max_batch, "swap"),
        crops=[batched(stage, batching.enhance_max_batch) for stage in crops],
    )
    return FramePipeline(detector, engine, config=config, stages=stages)
