"""Occlusion and flicker measured per engine, for `swapcast bench-quality` and `swapcast bench-stability`.

The engine's pipeline is built twice (occlusion off and on) over the same model store; the source face is
t1's, the clips are the astronaut's (app.bench.occlusion_bench, app.bench.flicker_bench).
"""

import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from app.bench import flicker_bench, occlusion_bench
from app.media.clips import load_sample
from app.pipeline.factory import build_pipeline
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.settings import PipelineSettings
from engines.store import ModelStore


def measure(
    engines: Iterable[str],
    store: ModelStore,
    *,
    frames: int = 40,
    hand_model: str = "hand_landmark_lite",
    occlusion: bool = True,
    flicker: bool = True,
    raw_landmarks: bool = False,
    threads: int | None = None,
) -> dict[str, Any]:
    """{"occlusion": {engine: figures}, "flicker": rows} over `engines` (each flicker row names its engine);
    `raw_landmarks` adds the mesh engine's clips without its One-Euro smoothing (what the smoothing buys)."""
    extra: dict[str, Any] = {"threads": threads} if threads else {}
    hands: dict[str, Any] = {"occlusion": "hands", "hand_model": hand_model}
    report: dict[str, Any] = {"occlusion": {}, "flicker": []}
    for engine in engines:
        off = build_pipeline(PipelineSettings(engine=engine, faces="largest", occlusion="off", **extra), store)
        on = (
            build_pipeline(PipelineSettings(engine=engine, faces="largest", **hands, **extra), store)
            if occlusion
            else None
        )
        try:
            source = off.prepare_source(load_sample("t1"))
            if on is not None:
                report["occlusion"][engine] = {"hand_model": hand_model, **occlusion_bench.run(off, on, source, frames)}
            if flicker:
                report["flicker"] += _flicker_rows(engine, off, source, raw_landmarks)
        finally:
            off.close()
            if on is not None:
                on.close()
    return report


def _flicker_rows(
    engine: str, pipeline: FramePipeline, source: PreparedSource, raw_landmarks: bool
) -> list[dict[str, Any]]:
    (faces,) = pipeline.detector.process([load_sample("astronaut")])
    truth = faces[0].landmarks
    # Only tracked dense landmarks (mesh) are One-Euro smoothed; the others' five points are the tracker's
    # Kalman-filtered ones either way.
    variants = [("one-euro" if engine == "mesh" else "kalman", pipeline.config)]
    if engine == "mesh" and raw_landmarks:
        variants.append(("raw", replace(pipeline.config, smoothing=None)))
    rows = []
    for label, config in variants:
        pipeline.config = config
        for spec in flicker_bench.CLIPS:
            row, _ = flicker_bench.run_clip(engine, pipeline, source, spec, truth, time.perf_counter)
            rows.append({**flicker_bench.rows_as_dicts([row])[0], "landmarks": label})
    return rows


def occlusion_figures(report: dict[str, Any]) -> dict[str, float]:
    """The figures the occlusion rows judge: shares, and the stage's mean time per face (amortised over the
    look schedule: every frame while a hand is over the face, every few frames or on a change otherwise)."""
    return {
        "hand_kept": report["hand_kept"],
        "hand_kept_min": report["hand_kept_min"],
        "iou": report["iou"],
        "face_swapped": report["face_swapped"],
        "ms_per_face": report["occlusion_ms_per_face"].get("mean", float("nan")),
        "ms_per_face_no_hand": report["occlusion_ms_per_face_no_hand"].get("mean", float("nan")),
        "cpu_ms_per_face": report["occlusion_cpu_ms_per_face"].get("mean", float("nan")),
        "cpu_ms_per_face_no_hand": report["occlusion_cpu_ms_per_face_no_hand"].get("mean", float("nan")),
    }


def flicker_figures(rows: list[dict[str, Any]]) -> dict[str, float]:
    """The figures the flicker rows judge, from the engine's own landmarks' clips (smoothed as shipped)."""
    by_clip = {row["clip"]: row for row in rows if row["landmarks"] != "raw"}
    return {
        "still_flicker_ratio": by_clip["still"]["flicker_ratio"],
        "near_still_flicker_ratio": by_clip["near_still"]["flicker_ratio"],
        "still_jitter_px": by_clip["still"]["jitter_px"],
        "slow_jitter_px": by_clip["slow"]["jitter_px"],
        "fast_lag_frames": by_clip["fast"]["lag_frames"],
    }
