"""Builds a FramePipeline from settings and the model store, checking every model once at load time."""

from dataclasses import replace

from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.enhance import EnhanceConfig, RealEsrganEnhancer
from app.pipeline.paste import PasteConfig
from app.pipeline.pipeline import FramePipeline, PipelineConfig
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.swap import ClassicEngine, InswapperEngine, PassthroughEngine, SwapEngine
from app.pipeline.track import TrackerConfig
from app.runtime.onnx import OnnxModel
from app.settings import PipelineSettings
from engines.registry import get_entry
from engines.store import ModelStore


def load_model(store: ModelStore, name: str, settings: PipelineSettings) -> OnnxModel:
    return OnnxModel(store.ensure(name), threads=settings.threads)


def build_engine(settings: PipelineSettings, store: ModelStore) -> SwapEngine:
    if settings.engine == "classic":
        return ClassicEngine()
    if settings.engine == "passthrough":
        return PassthroughEngine()
    recognizer = ArcFaceRecognizer(load_model(store, settings.recognizer_model, settings))
    return InswapperEngine(load_model(store, settings.swapper_model, settings), recognizer)


def build_pipeline(settings: PipelineSettings, store: ModelStore | None = None) -> FramePipeline:
    store = store or ModelStore()
    detector = RetinaFaceDetector(
        load_model(store, settings.detector_model, settings),
        DetectorConfig(
            size=settings.detect_size,
            score_threshold=settings.detect_threshold,
            refine_landmarks=settings.refine_landmarks,
        ),
    )
    engine = build_engine(settings, store)
    enhancer = None
    if settings.enhancer_model:
        scale = get_entry(settings.enhancer_model).scale or 1
        enhancer = RealEsrganEnhancer(
            load_model(store, settings.enhancer_model, settings), scale, EnhanceConfig(blend=settings.enhance_blend)
        )
    # The classic engine's texture includes hair and background, so only the face proper is pasted.
    mask = settings.mask if settings.mask != "auto" else ("ellipse" if engine.name == "classic" else "box")
    config = PipelineConfig(
        faces=settings.faces,
        tracker=replace(TrackerConfig(), detect_interval=settings.detect_interval),
        paste=PasteConfig(mask=mask, color_strength=settings.color_strength),
    )
    return FramePipeline(detector, engine, enhancer, config)
