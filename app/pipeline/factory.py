"""Builds a FramePipeline from settings and the model store, checking every model once at load time."""

from dataclasses import replace
from pathlib import Path

from prometheus_client import CollectorRegistry

from app.model_store import hand_model_in_store, resolve_swap_engine
from app.names import SwapEngineName
from app.pipeline.batching import BatchedStage, BatchSettings
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.enhance import EnhanceConfig, RealEsrganEnhancer
from app.pipeline.landmarks import FaceMeshLandmarker
from app.pipeline.mesh import MeshConfig, MeshEngine
from app.pipeline.mouth import MouthKeepingEngine
from app.pipeline.occlusion import HandFinder
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
from engines.onnx_batch import rewrite_if_fixed_batch
from engines.registry import get_entry
from engines.store import ModelStore


def load_model(store: ModelStore, name: str, settings: PipelineSettings) -> Model:
    path = store.ensure(name)
    return _load(path, settings, source=path, source_sha256=store.expected(name)[0])


def _load(path: Path, settings: PipelineSettings, *, source: Path, source_sha256: str | None) -> Model:
    """The backend and precision variant that settings.backend/precision pick (app.runtime.backend)."""
    if settings.backend == "triton":
        from app.runtime.triton import TritonModel

        return TritonModel(settings.triton_url, source, name=source.stem, shared_memory=settings.triton_shm)
    return load_backend(
        path, settings.local_backend, settings.threads, settings.precision, source=source, source_sha256=source_sha256
    )


def load_batchable(store: ModelStore, name: str, settings: PipelineSettings) -> Model:
    """The model with a dynamic batch dimension. Graphs saved with a fixed batch of 1 (the real inswapper)
    run from their batch-dynamic rewrite (engines.onnx_batch.rewrite_if_fixed_batch); a graph that cannot
    be rewritten runs item by item, and the log says so once."""
    model = load_model(store, name, settings)
    files = store.files(name)
    if not model.fixed_batch or model.path != files.model:  # variants and engines are made batch-dynamic
        return model
    runnable = rewrite_if_fixed_batch(files)
    if runnable == files.model:
        return model
    model.close()
    return _load(runnable, settings, source=files.model, source_sha256=files.sha256)


def load_landmarker(store: ModelStore, settings: PipelineSettings) -> FaceMeshLandmarker:
    return FaceMeshLandmarker(load_model(store, settings.landmark_model, settings))


def build_hand_finder(settings: PipelineSettings, store: ModelStore) -> HandFinder | None:
    """The occlusion stage `settings.occlusion` asks for: `hands` imports `settings.hand_model` when missing (a
    ModelError where it cannot); `auto` uses it, or failing it the other hand model, only where it is in the store
    already (app.model_store.hand_model_in_store); `off` is None."""
    if settings.occlusion == "off":
        return None
    name = hand_model_in_store(settings, store) if settings.occlusion == "auto" else settings.hand_model
    if name is None:
        return None
    local = settings.model_copy(update={"backend": settings.local_backend})
    return HandFinder(load_model(store, name, local))


def build_swap_engine(settings: PipelineSettings, store: ModelStore) -> SwapEngine:
    """The swap engine `settings` name (`auto` resolved by app.model_store.resolve_swap_engine); with a mouth
    mask, engines that keep no mouth of their own are wrapped to give the target's mouth back."""
    swap_engine = resolve_swap_engine(settings, store)
    if swap_engine == "mesh":
        config = MeshConfig(
            mouth_mask=settings.mouth_mask, color_strength=settings.color_strength, shape=settings.mesh_shape
        )
        return MeshEngine(load_landmarker(store, settings), config)
    engine = _mouthless_engine(swap_engine, settings, store)
    if settings.mouth_mask > 0:
        return MouthKeepingEngine(engine, load_landmarker(store, settings), settings.mouth_mask)
    return engine


def _mouthless_engine(swap_engine: SwapEngineName, settings: PipelineSettings, store: ModelStore) -> SwapEngine:
    """The engines that keep no mouth of their own: classic, passthrough, inswapper."""
    if swap_engine == "classic":
        return ClassicEngine()
    if swap_engine == "passthrough":
        return PassthroughEngine()
    recognizer = ArcFaceRecognizer(load_model(store, settings.recognizer_model, settings))
    swapper = load_batchable(store, settings.swapper_model, settings)
    files = store.files(settings.swapper_model)
    # FP32 graphs keep emap as their last initializer; variants and engines take it from their source.
    fp32 = swapper.path in (files.model, files.dynamic)
    return InswapperEngine(swapper, recognizer, emap=None if fp32 else last_initializer(files.model))


def build_pipeline(
    settings: PipelineSettings,
    store: ModelStore,
    *,
    batching: BatchingSettings | None = None,
    registry: CollectorRegistry | None = None,
    live: bool = False,
) -> FramePipeline:
    """The pipeline for `settings`. With `batching`, every model stage goes through one shared dynamic
    batcher per stage (live serving); without, models are called directly (files, benchmarks). Frames of a
    `live` pipeline (the server's, batched or not) are detected at `live_detect_size`; still photos, and
    the frames of files, at `detect_size`."""
    detect_config = DetectorConfig(
        size=settings.detect_size,
        score_threshold=settings.detect_threshold,
        refine_landmarks=settings.refine_landmarks,
    )
    # Whole frames stay in this process even with Triton: a 720p float frame costs 61 ms over gRPC on
    # loopback against 1 ms for RetinaFace itself (measured); face crops and latents are what Triton gets.
    local = settings.model_copy(update={"backend": settings.local_backend})
    detector = RetinaFaceDetector(load_model(store, settings.detector_model, local), detect_config)
    engine = build_swap_engine(settings, store)
    hands = build_hand_finder(settings, store)
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
        tracker=replace(
            TrackerConfig(),
            detect_interval=settings.detect_interval,
            on_face_lost=settings.on_face_lost,
            hold_frames=settings.hold_frames,
        ),
        live_detect_interval=settings.live_detect_interval,
        live_detect_background=settings.live_detect_background,
        # The mesh engine matches colour under its own face mask: paste-back leaves its crops as they are.
        paste=PasteConfig(mask=mask, color_strength=0.0 if engine.name == "mesh" else settings.color_strength),
    )
    if batching is None:
        if not live:
            return FramePipeline(detector, engine, crops, config, hands=hands)
        frames = RetinaFaceDetector(detector.model, replace(detect_config, size=settings.live_detect_size))
        return FramePipeline(detector, engine, config=config, stages=Stages(frames, engine, tuple(crops)), hands=hands)

    def batched(stage: Stage[In, Out], max_batch: int, name: str | None = None) -> BatchedStage[In, Out]:
        return BatchedStage(stage, BatchSettings.from_settings(batching, max_batch), registry, name=name)

    # Shared detection letterboxes every frame onto one canvas, so frames of any size share a batch and a
    # frame's result does not depend on its batch-mates; stills (identity uploads) keep the tight canvas
    # and their own size.
    live_detector = RetinaFaceDetector(
        detector.model, replace(detect_config, canvas="fixed", size=settings.live_detect_size)
    )
    stages = Stages(
        detect=batched(live_detector, batching.detect_max_batch),
        swap=batched(engine, batching.swap_max_batch, "swap"),
        crops=[batched(stage, batching.enhance_max_batch) for stage in crops],
    )
    return FramePipeline(detector, engine, config=config, stages=stages, hands=hands)
