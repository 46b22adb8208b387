"""`swapcast bench-batch`: N live sessions at 30 fps sharing the models, batched versus one model call per
frame, side by side in one run.

Each simulated session behaves like a live stream: a new frame is offered every 1/30 s, the session
works on the newest one when it is free and the frames offered meanwhile are dropped (counted).
Frames are 640×480 views of a real face (scikit-image's astronaut) with known motion.
"""

import os
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np
from prometheus_client import CollectorRegistry

from app.media.clips import load_sample, make_motion_clip
from app.pipeline.batching import BatchedStage, BatchSettings
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.paste import PasteConfig
from app.pipeline.pipeline import FramePipeline, PipelineConfig, Stages
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.swap import InswapperEngine, PreparedSource
from app.pipeline.timing import percentiles_ms
from app.pipeline.types import Face, Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


@dataclass(frozen=True)
class BatchBenchConfig:
    networks: tuple[str, ...] = ("reference_swapper_narrow", "reference_swapper_full")
    sessions: tuple[int, ...] = (1, 2, 4, 8)
    seconds: dict[str, float] = field(
        default_factory=lambda: {"reference_swapper_narrow": 4.0, "reference_swapper_full": 10.0}
    )
    fps: int = 30
    max_batch: int = 8
    max_delay_ms: float = 4.0
    threads: int = field(default_factory=lambda: os.cpu_count() or 1)


@dataclass
class SessionResult:
    latencies: list[float] = field(default_factory=list)
    faces: int = 0
    offered: int = 0
    dropped: int = 0
    errors: int = 0


def run_session(
    pipeline: FramePipeline,
    source: PreparedSource,
    frames: list[Image],
    name: str,
    start: float,
    stop: float,
    fps: int,
    result: SessionResult,
) -> None:
    tracker = pipeline.new_stream()
    next_index = 0
    while True:
        now = time.monotonic()
        if now >= stop:
            break
        newest = int((now - start) * fps)
        if newest < next_index:
            time.sleep(max(0.0, start + next_index / fps - now))
            continue
        result.dropped += newest - next_index
        offered_at = start + newest / fps
        try:
            (out,) = pipeline.process([frames[newest % len(frames)]], source, tracker, session=name)
        except Exception:  # a batcher error for this frame: counted, the session goes on
            result.errors += 1
        else:
            result.latencies.append(time.monotonic() - offered_at)
            result.faces += len(out.faces)
        next_index = newest + 1
    result.offered = int((stop - start) * fps)


def run_sessions(
    pipeline: FramePipeline, source: PreparedSource, frames: list[Image], sessions: int, seconds: float, fps: int
) -> tuple[list[SessionResult], float]:
    """`sessions` live sessions for `seconds`; their results and the time taken (frames in flight included)."""
    results = [SessionResult() for _ in range(sessions)]
    start = time.monotonic() + 0.05
    stop = start + seconds
    threads = [
        threading.Thread(
            target=run_session,
            args=(pipeline, source, frames, f"s{i}", start + i / (fps * sessions), stop, fps, results[i]),
        )
        for i in range(sessions)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.monotonic() - start  # includes finishing the frames in flight at `stop`


def summarize(results: list[SessionResult], elapsed: float) -> dict[str, Any]:
    latencies = [x for r in results for x in r.latencies]
    offered = sum(r.offered for r in results)
    processed = len(latencies)
    return {
        "faces_per_s": round(sum(r.faces for r in results) / elapsed, 2) if elapsed > 0 else 0.0,
        "frames_processed": processed,
        "latency_ms": percentiles_ms(latencies),
        "offered": offered,
        "dropped": sum(r.dropped for r in results),
        "dropped_fraction": round(1 - processed / offered, 3) if offered else None,
        "errors": sum(r.errors for r in results),
    }


def run_cell(
    pipeline: FramePipeline, source: PreparedSource, frames: list[Image], sessions: int, seconds: float, fps: int
) -> dict[str, Any]:
    return summarize(*run_sessions(pipeline, source, frames, sessions, seconds, fps))


def _mean_batch(stage: object) -> float | None:
    if not isinstance(stage, BatchedStage):
        return None
    return round(stage.batcher.stats().mean_batch_size, 2)


def _batched_stages(detector: RetinaFaceDetector, engine: InswapperEngine, settings: BatchSettings) -> Stages:
    """Shared batchers around the bench's models, as the factory builds them for live serving."""
    registry = CollectorRegistry()  # per cell: each cell's counters start at zero
    live_detector = RetinaFaceDetector(detector.model, replace(detector.config, canvas="fixed"))
    return Stages(
        detect=BatchedStage(live_detector, settings, registry),
        swap=BatchedStage(engine, settings, registry, name="swap"),
    )


class Scene(NamedTuple):
    """What every batching bench runs on: the astronaut's still, its face, a clip of it moving, and the
    detector and recognizer (the caller closes them)."""

    still: Image
    face: Face
    frames: list[Image]
    detector: RetinaFaceDetector
    recognizer: ArcFaceRecognizer


def astronaut_scene(store: ModelStore, threads: int) -> Scene:
    still = load_sample("astronaut")
    detector = RetinaFaceDetector(OnnxModel(store.ensure("retinaface_mnet025"), threads=threads))
    (faces,) = detector.process([still])
    centre = (float(faces[0].landmarks[:, 0].mean()), float(faces[0].landmarks[:, 1].mean()))
    frames = make_motion_clip(still, size=(640, 480), frames=60, focus=centre, seed=1).frames
    recognizer = ArcFaceRecognizer(OnnxModel(store.ensure("reference_recognizer"), threads=threads))
    return Scene(still, faces[0], frames, detector, recognizer)


def run_batch_bench(config: BatchBenchConfig, store: ModelStore) -> dict[str, Any]:
    still, face, frames, detector, recognizer = astronaut_scene(store, config.threads)
    rows = []
    for network in config.networks:
        engine = InswapperEngine(OnnxModel(store.ensure(network), threads=config.threads), recognizer)
        source = engine.prepare(still, face)
        seconds = config.seconds.get(network, 5.0)
        for sessions in config.sessions:
            cell: dict[str, Any] = {"network": network, "sessions": sessions}
            for mode in ("unbatched", "batched"):
                stages = None
                if mode == "batched":
                    settings = BatchSettings(
                        max_batch=config.max_batch, max_delay_ms=config.max_delay_ms, deadline_ms=None
                    )
                    stages = _batched_stages(detector, engine, settings)
                pipeline = FramePipeline(
                    detector, engine, config=PipelineConfig(paste=PasteConfig(mask="box")), stages=stages
                )
                # Warm-up as the first session: under another name it would count as a second active
                # session for the batcher's active window (a second), which no lone live stream has.
                pipeline.process([frames[0]], source, session="s0")
                try:
                    cell[mode] = run_cell(pipeline, source, frames, sessions, seconds, config.fps)
                    cell[mode]["mean_batch_swap"] = _mean_batch(pipeline.stages.swap)
                    cell[mode]["mean_batch_detect"] = _mean_batch(pipeline.stages.detect)
                finally:
                    # Only the batchers stop here: the models serve the next cell (closed at the end).
                    for stage in (pipeline.stages.detect, pipeline.stages.swap):
                        if isinstance(stage, BatchedStage):
                            stage.batcher.close(timeout=5.0)
            unbatched, batched = cell["unbatched"], cell["batched"]
            cell["ratio_faces_per_s"] = (
                round(batched["faces_per_s"] / unbatched["faces_per_s"], 2) if unbatched["faces_per_s"] else None
            )
            p50_b, p50_u = batched["latency_ms"].get("p50"), unbatched["latency_ms"].get("p50")
            cell["ratio_p50_latency"] = round(p50_b / p50_u, 2) if p50_b and p50_u else None
            rows.append(cell)
        engine.swapper.close()  # the recognizer serves the next network
    detector.close()
    recognizer.close()
    return {
        "benchmark": "batch",
        "threads": config.threads,
        "fps_per_session": config.fps,
        "frame": "640x480, one real face",
        "batcher": {"max_batch": config.max_batch, "max_delay_ms": config.max_delay_ms},
        "swap_weights": "untrained reference networks (cost and plumbing only)",
        "ratios": "batched / unbatched (faces_per_s above 1 and latency below 1 favour batching)",
        "rows": rows,
        "np_version": np.__version__,
    }
