"""`swapcast bench-content`: the content gate's false positives and cost.

Scores every sample face photo on this machine (`app.media.clips.sample_faces`), the faces the detector cuts from
them (as the tests cut them), and motion clips made from each photo (the sample videos the tests and benchmarks
use; no video of a real person ships anywhere) at the live sizes; reports the score distribution against the
threshold, then the cost of one check (one image, an input and output pair, a batch of eight) and what the live
schedule costs per stream-second: measured through the live gate itself on a still and a moving 720p clip, with
every due check scored (`unchanged_s` 0) and with unchanged pictures skipped (the configured `unchanged_s`).
"""

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.content.check import ContentCheck, prepare
from app.content.live import ContentService
from app.media.clips import load_sample, make_motion_clip, sample_faces
from app.observability import Metrics
from app.pipeline.types import Image

CLIP_SIZES = ((640, 480), (1280, 720))
# The live schedule's clips, one frame per due check, with a camera's noise (2 grey levels): (pan px, zoom, roll
# degrees) of a camera on a stand filming someone sitting still (a pixel of drift) and of the sample clips' slow
# pan, zoom and roll (make_motion_clip's defaults), one loop over the stream.
SCHEDULE_CLIPS: dict[str, tuple[float, float, float]] = {"still": (1.0, 0.0, 0.0), "moving": (24.0, 0.15, 6.0)}


@dataclass(frozen=True)
class ContentBenchConfig:
    threshold: float
    interval_s: float
    clip_frames: int = 30
    repeats: int = 20
    unchanged_s: float = 5.0
    stream_s: int = 20  # stream time of each live-schedule run


def _crops(image: Image, boxes: Sequence[Any]) -> list[Image]:
    """Each face with a margin of half its size, as a thumbnail or a test crop frames it."""
    height, width = image.shape[:2]
    crops = []
    for box in boxes:
        x1, y1, x2, y2 = (float(v) for v in box)
        mx, my = (x2 - x1) / 2, (y2 - y1) / 2
        top, bottom = int(max(0, y1 - my)), int(min(height, y2 + my))
        left, right = int(max(0, x1 - mx)), int(min(width, x2 + mx))
        if bottom - top > 8 and right - left > 8:
            crops.append(np.ascontiguousarray(image[top:bottom, left:right]))
    return crops


def _summary(scores: Sequence[float], threshold: float) -> dict[str, Any]:
    values = np.asarray(scores, np.float64)
    return {
        "images": int(values.size),
        "max": round(float(values.max()), 5),
        "p99": round(float(np.percentile(values, 99)), 5),
        "p50": round(float(np.percentile(values, 50)), 5),
        "min": round(float(values.min()), 5),
        "flagged": int((values >= threshold).sum()),
    }


def _timed(run: Any, repeats: int) -> dict[str, float]:
    run()  # warm
    samples = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        samples.append(time.perf_counter() - started)
    ms = np.asarray(samples) * 1000.0
    return {"p50_ms": round(float(np.percentile(ms, 50)), 2), "p99_ms": round(float(np.percentile(ms, 99)), 2)}


def _schedule(check: ContentCheck, frames: Sequence[Image], interval_s: float, unchanged_s: float) -> dict[str, Any]:
    """One stream's due checks through the live gate, one frame per interval (its output is its input: no swap
    here); the process CPU it took (the scoring thread's included) per second of stream."""
    service = ContentService(check, "blur", interval_s, Metrics(), unchanged_s=unchanged_s)
    gate = service.gate("stream", "bench", "", lambda reason: None)
    try:
        started = time.process_time()
        for n, frame in enumerate(frames):
            sampled = gate.sample(frame, now=n * interval_s)
            if sampled is None:
                raise RuntimeError("a due check was not sampled")
            gate.apply(frame, sampled)
            give_up = time.monotonic() + 60.0
            while gate.scored + gate.skipped <= n:  # the check (if any) is scored on the batcher's thread
                if time.monotonic() > give_up:
                    raise RuntimeError("a live check did not finish within 60 s (see the log)")
                time.sleep(0.001)
        cpu_s = time.process_time() - started
    finally:
        service.batcher.close(timeout=5.0)  # not service.close: the check serves the next run
    seconds = len(frames) * interval_s
    return {
        "checks_scored": gate.scored,
        "checks_skipped": gate.skipped,
        "cpu_ms_per_stream_second": round(cpu_s * 1000.0 / seconds, 1),
        "core_share_per_stream": round(cpu_s / seconds, 4),
    }


def live_schedule(check: ContentCheck, config: ContentBenchConfig, still: Image) -> dict[str, Any]:
    """Before (every due check scored) and after (unchanged pictures skipped), on each schedule clip."""
    rows: dict[str, Any] = {}
    for name, (pan_px, zoom, rotate_deg) in SCHEDULE_CLIPS.items():
        frames = make_motion_clip(
            still,
            size=(1280, 720),
            frames=config.stream_s,
            fps=1,
            pan_px=pan_px,
            zoom=zoom,
            rotate_deg=rotate_deg,
            noise_sigma=2.0,
            seed=1,
        ).frames
        rows[name] = {
            "every_check": _schedule(check, frames, config.interval_s, 0.0),
            "skip_unchanged": _schedule(check, frames, config.interval_s, config.unchanged_s),
        }
    return {"stream_s": config.stream_s, "unchanged_s": config.unchanged_s, "size": "1280x720", "clips": rows}


def run_content_bench(check: ContentCheck, config: ContentBenchConfig, boxes: Any) -> dict[str, Any]:
    """`boxes(image)`: the face boxes the detector finds in an image."""
    groups: dict[str, list[float]] = {}
    per_image: dict[str, float] = {}
    for name in sorted(sample_faces()):
        still = load_sample(name)
        (score,) = check.scores([still])
        per_image[name] = round(float(score), 5)
        groups.setdefault("photos", []).append(float(score))
        crops = _crops(still, boxes(still))
        if crops:
            groups.setdefault("face_crops", []).extend(float(s) for s in check.scores(crops))
        for size in CLIP_SIZES:
            clip = make_motion_clip(still, size=size, frames=config.clip_frames, noise_sigma=2.0, seed=1)
            key = f"clips_{size[0]}x{size[1]}"
            for start in range(0, len(clip.frames), 8):
                groups.setdefault(key, []).extend(float(s) for s in check.scores(clip.frames[start : start + 8]))
    if not groups:
        raise ValueError("no sample face photos on this machine (install insightface or scikit-image)")
    everything = [s for scores in groups.values() for s in scores]
    frame = make_motion_clip(load_sample(sorted(sample_faces())[0]), size=(1280, 720), frames=1).frames[0]
    pair = [frame, frame.copy()]
    eight = [frame] * 8
    one = _timed(lambda: check.scores([frame]), config.repeats)
    two = _timed(lambda: check.scores(pair), config.repeats)
    cost = {
        "prepare_720p": _timed(lambda: prepare(frame), config.repeats),
        "check_1": one,
        "check_pair": two,
        "check_8": _timed(lambda: check.scores(eight), max(3, config.repeats // 4)),
        # One input and output pair per interval: the share of one core each live stream costs.
        "core_share_per_stream": round(two["p50_ms"] / 1000.0 / config.interval_s, 4),
        "ms_per_stream_second": round(two["p50_ms"] / config.interval_s, 2),
    }
    return {
        "threshold": config.threshold,
        "interval_s": config.interval_s,
        "scores": {name: _summary(values, config.threshold) for name, values in groups.items()},
        "all": _summary(everything, config.threshold),
        "photos": per_image,
        "cost": cost,
        "live_schedule": live_schedule(check, config, load_sample(sorted(sample_faces())[0])),
    }
