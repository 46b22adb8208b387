"""`swapcast bench`: per-stage latency of our pipeline and of the reference path, same frames, same run.

Frames are real faces (crops of insightface's t1.jpg group photo and scikit-image's astronaut) laid over a
real background at 720p and 1080p with one and three faces. Each frame is decoded from H.264, swapped and
encoded again; decode and encode are the same code for both paths and are reported once.
"""

import contextlib
import io
import os
import platform
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np

from app.bench.reference_path import ReferencePath
from app.bench.scenes import RESOLUTIONS, compose_scene, jittered
from app.media.clips import load_sample
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.enhance import RealEsrganEnhancer
from app.pipeline.paste import PasteConfig
from app.pipeline.pipeline import FramePipeline, PipelineConfig
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.swap import InswapperEngine
from app.pipeline.timing import StageTimer, percentiles_ms
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from engines.registry import get_entry as registry_entry
from engines.store import ModelStore


@dataclass(frozen=True)
class BenchConfig:
    swapper_model: str = "reference_swapper_full"
    recognizer_model: str = "reference_recognizer"
    detector_model: str = "retinaface_mnet025"
    enhancer_model: str | None = None
    frames: int = 4
    resolutions: tuple[str, ...] = ("720p", "1080p")
    face_counts: tuple[int, ...] = (1, 3)
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)
    reference: bool = True


def portraits(detector: RetinaFaceDetector, count: int) -> list[Image]:
    """Head-and-shoulders crops of real people, cut around the detector's boxes."""
    group = load_sample("t1")
    (faces,) = detector.process([group])
    crops = [load_sample("astronaut")[0:300, 100:350]]
    for face in sorted(faces, key=lambda f: -f.area):
        x1, y1, x2, y2 = face.box
        w, h = x2 - x1, y2 - y1
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        half = max(w, h) * 1.1
        top, bottom = int(max(0, cy - half)), int(min(group.shape[0], cy + half))
        left, right = int(max(0, cx - half * 0.85)), int(min(group.shape[1], cx + half * 0.85))
        crops.append(np.ascontiguousarray(group[top:bottom, left:right]))
    return crops[:count]


def encode_h264(frames: list[Image], fps: int = 30) -> bytes:
    buffer = io.BytesIO()
    with av.open(buffer, "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=fps)
        stream.height, stream.width = frames[0].shape[:2]
        stream.pix_fmt = "yuv420p"
        stream.options = {"preset": "veryfast", "crf": "18"}
        for frame in frames:
            container.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="bgr24")))
        container.mux(stream.encode(None))
    return buffer.getvalue()


class TimedEncoder:
    """The encode stage: H.264 like the CLI writes, one frame at a time, timed per frame."""

    def __init__(self, width: int, height: int, timer: StageTimer) -> None:
        self.timer = timer
        self.codec = av.CodecContext.create("libx264", "w")
        self.codec.width, self.codec.height = width, height
        self.codec.pix_fmt = "yuv420p"
        self.codec.time_base = Fraction(1, 30)
        self.codec.options = {"preset": "veryfast", "crf": "18"}
        self.index = 0

    def encode(self, image: Image) -> None:
        with self.timer.stage("encode"):
            frame = av.VideoFrame.from_ndarray(image, format="bgr24")
            frame.pts = self.index
            self.index += 1
            self.codec.encode(frame)


def decode_timed(data: bytes, timer: StageTimer) -> list[Image]:
    out = []
    with av.open(io.BytesIO(data), mode="r") as container:
        frames = container.decode(video=0)
        while True:
            start = time.perf_counter()
            try:
                frame = next(frames)
            except StopIteration:
                break
            image = np.asarray(frame.to_ndarray(format="bgr24"), np.uint8)
            timer.add("decode", time.perf_counter() - start)
            out.append(image)
    return out


def _ratio(reference: float | None, ours: float | None) -> float | None:
    if not reference or not ours:
        return None
    return round(reference / ours, 2)


def run_scenario(
    pipeline: FramePipeline,
    reference: ReferencePath | None,
    embedding: np.ndarray,
    scene: Image,
    config: BenchConfig,
) -> dict[str, Any]:
    assert isinstance(pipeline.engine, InswapperEngine)
    source = pipeline.engine.prepare_embedding(embedding)
    shared = StageTimer()
    frames = decode_timed(encode_h264(jittered(scene, config.frames)), shared)
    encoder = TimedEncoder(scene.shape[1], scene.shape[0], shared)
    ours = StageTimer()
    pipeline.process([frames[0]], source)  # warm-up: first-call allocations are not the steady state
    if reference is not None:
        reference.process(frames[0], embedding)
        reference.reset_timer()
    # The two paths alternate frame by frame, so load from elsewhere on the machine hits both alike.
    end_to_end, ref_total = [], []
    for frame in frames:
        start = time.perf_counter()
        (result,) = pipeline.process([frame], source, timer=ours)
        end_to_end.append(time.perf_counter() - start)
        encoder.encode(result.image)
        if reference is not None:
            start = time.perf_counter()
            reference.process(frame, embedding)
            ref_total.append(time.perf_counter() - start)
    summary: dict[str, Any] = {
        "faces_found": len(result.faces),
        "decode": percentiles_ms(shared.samples["decode"]),
        "encode": percentiles_ms(shared.samples["encode"]),
        "ours": {**ours.summary(), "pipeline": percentiles_ms(end_to_end)},
    }
    glue = [a + p for a, p in zip(ours.samples["align"], ours.samples["paste"], strict=True)]
    summary["ours"]["align_paste"] = percentiles_ms(glue)
    if reference is None:
        return summary
    ref = reference.timer.samples
    summary["reference"] = {
        "faces_found": reference.last_faces,
        **{stage: percentiles_ms(ref[stage]) for stage in ("detect", "swap", "align_paste")},
        "pipeline": percentiles_ms(ref_total),
    }
    ours_summary, ref_summary = summary["ours"], summary["reference"]
    summary["ratio_reference_over_ours_p50"] = {
        stage: _ratio(ref_summary[stage].get("p50"), ours_summary.get(stage, {}).get("p50"))
        for stage in ("detect", "swap", "align_paste", "pipeline")
    }
    coded = summary["decode"]["p50"] + summary["encode"]["p50"]
    summary["ratio_end_to_end_p50"] = _ratio(
        ref_summary["pipeline"]["p50"] + coded, ours_summary["pipeline"]["p50"] + coded
    )
    return summary


def run_bench(config: BenchConfig, store: ModelStore) -> dict[str, Any]:
    detector_path = store.ensure(config.detector_model)
    swapper_path = store.ensure(config.swapper_model)
    detector = RetinaFaceDetector(OnnxModel(detector_path, threads=config.threads), DetectorConfig())
    recognizer = ArcFaceRecognizer(OnnxModel(store.ensure(config.recognizer_model), threads=config.threads))
    engine = InswapperEngine(OnnxModel(swapper_path, threads=config.threads), recognizer)
    enhancer = None
    if config.enhancer_model:
        scale = registry_entry(config.enhancer_model).scale or 1
        enhancer = RealEsrganEnhancer(OnnxModel(store.ensure(config.enhancer_model), threads=config.threads), scale)
    crops = [enhancer] if enhancer is not None else []
    pipeline = FramePipeline(detector, engine, crops, PipelineConfig(paste=PasteConfig(mask="box")))
    reference = None
    if config.reference:
        with contextlib.redirect_stdout(io.StringIO()):  # INSwapper prints its input shape
            reference = ReferencePath(detector_path, swapper_path, config.threads)
    people = portraits(detector, max(config.face_counts))
    source_image = load_sample("astronaut")
    (source_faces,) = detector.process([source_image])
    embedding = recognizer.embed(source_image, source_faces[0])
    background = load_sample("t1")[640:]  # the card table: no faces
    results = []
    for resolution in config.resolutions:
        for count in config.face_counts:
            scene = compose_scene(people[:count], background, RESOLUTIONS[resolution])
            scenario = run_scenario(pipeline, reference, embedding, scene, config)
            results.append({"resolution": resolution, "faces": count, **scenario})
    untrained = "untrained" if "reference" in config.swapper_model else "user-supplied"
    return {
        "benchmark": "pipeline",
        "machine": {"cpu": platform.processor() or platform.machine(), "threads": config.threads},
        "swapper": {"model": config.swapper_model, "weights": untrained, "file": Path(swapper_path).name},
        "enhancer": config.enhancer_model,
        "frames_per_scenario": config.frames,
        "units": "milliseconds per frame (p50/p99); ratios are reference / ours (above 1: ours is faster)",
        "scenarios": results,
    }
