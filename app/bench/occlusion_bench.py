"""Occlusion as numbers: a real hand crossing a real face (app.bench.hand_scene), swapped with occlusion on and
off, as a stream.

Per frame where the hand is over the face, on the pixels the swap paints over when occlusion is off:

- hand kept: the share of the hand's pixels that stay the input's own with occlusion on;
- IoU: between the pixels kept (the input's own with occlusion on) and the hand's true pixels;
- face swapped: the share of the other painted pixels (the face outside the hand) still swapped.

Cost: the occlusion stage's time per face, wall-clock and the calling thread's CPU time (p50/p99, amortised
over the look schedule: a face is looked at every frame while a hand is over it, every `interval` frames or on a
change otherwise), and the whole frame's rate with occlusion on over off, on the crossing clip and on the same
face with no hand.
"""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.bench.hand_scene import HandCutout, HandScene, hand_cutout, paste_hand
from app.media.clips import load_sample
from app.pipeline.occlusion import HandFinder, hand_mask
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.pipeline.timing import StageTimer, call_times, percentiles_ms
from app.pipeline.types import Face, Image

NEAR = 12  # grey levels within which a pixel counts as the input's own
START, END = (150.0, 250.0), (275.0, 110.0)  # the hand's path across the astronaut's face (centre, px)
WIDTH = 150.0


def crossing(frames: int = 40, cutout: HandCutout | None = None) -> list[HandScene]:
    """The hand moving along a line across the face: off the face at first, over it, then off again."""
    cut = cutout or hand_cutout()
    face = load_sample("astronaut")
    path = np.linspace(START, END, frames)
    return [paste_hand(face, cut, (float(x), float(y)), WIDTH) for x, y in path]


def _near(a: Image, b: Image) -> np.ndarray:
    return np.abs(a.astype(np.int16) - b.astype(np.int16)).max(axis=2) <= NEAR


@dataclass
class FrameScore:
    hand_kept: float
    iou: float
    face_swapped: float


def score(scene: HandScene, off: Image, on: Image) -> FrameScore | None:
    """The frame's figures, or None where the hand is not over the painted face (under 200 pixels)."""
    painted = ~_near(off, scene.image)
    hand = scene.hand & painted
    if hand.sum() < 200:
        return None
    kept = _near(on, scene.image) & painted
    face = painted & ~scene.hand
    return FrameScore(
        hand_kept=float(kept[hand].mean()),
        iou=float((kept & hand).sum() / max(1, (kept | hand).sum())),
        face_swapped=float((~_near(on, scene.image))[face].mean()),
    )


class CpuAndWallTimer(StageTimer):
    """A StageTimer that also keeps each stage's CPU time on the calling thread, as `<stage>_cpu`: on a machine
    busy with other work, the stage's own work rather than its wait for a core (a model with one thread runs on
    the calling thread)."""

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        cpu = time.thread_time()
        try:
            with super().stage(name):
                yield
        finally:
            self.samples[f"{name}_cpu"].append(time.thread_time() - cpu)


@dataclass
class Streams:
    off: list[Image]
    on: list[Image]
    off_seconds: list[float]  # per frame
    on_seconds: list[float]
    timer: StageTimer  # the `on` stream's stages


def paired_streams(off: FramePipeline, on: FramePipeline, source: PreparedSource, frames: list[Image]) -> Streams:
    """The frames through both pipelines as two streams, each frame through `off` then `on` in turn, so that
    other work on the machine slows both alike (their medians compare)."""
    trackers = off.new_stream(), on.new_stream()
    result = Streams([], [], [], [], CpuAndWallTimer())
    for frame in frames:
        start = time.perf_counter()
        result.off.append(off.process([frame], source, trackers[0], StageTimer())[0].image)
        middle = time.perf_counter()
        result.on.append(on.process([frame], source, trackers[1], result.timer)[0].image)
        result.off_seconds.append(middle - start)
        result.on_seconds.append(time.perf_counter() - middle)
    return result


def _fps_ratio(streams: Streams) -> float:
    """Frame rate with occlusion over without: the ratio of the median frame times."""
    return round(float(np.median(streams.off_seconds) / np.median(streams.on_seconds)), 3)


def cpu_times(call: Callable[[], object], runs: int) -> list[float]:
    """CPU seconds the calling thread spent in each of `runs` calls: on a machine busy with other work, the
    work itself rather than the wait for a core (the hand model runs on the calling thread with one thread)."""
    return call_times(call, runs, clock=time.thread_time)


def look_costs(finder: HandFinder, scene: HandScene, face: Face, runs: int = 30) -> dict[str, Any]:
    """The occlusion stage's parts for one face, each run alone `runs` times: following a hand (one model pass),
    searching a face with no hand (two passes in one batch) and drawing the mask into a 128 px crop; wall-clock
    and, with `_cpu`, the calling thread's CPU time (meaningful with a one-thread model)."""
    hand = finder.hands(scene.image, [face], [None])[0]
    parts: dict[str, Callable[[], object]] = {"search": lambda: finder.hands(scene.face, [face], [None])}
    if hand is not None:
        matrix = np.array([[1.0, 0.0, -float(face.box[0])], [0.0, 1.0, -float(face.box[1])]])
        parts["follow"] = lambda: finder.hands(scene.image, [face], [hand])
        parts["mask"] = lambda: hand_mask([hand], matrix, 128, finder.config)
    costs: dict[str, Any] = {}
    for name, call in parts.items():
        costs[f"{name}_ms"] = percentiles_ms(call_times(call, runs))
        costs[f"{name}_cpu_ms"] = percentiles_ms(cpu_times(call, runs))
    return costs


def run(off: FramePipeline, on: FramePipeline, source: PreparedSource, frames: int = 40) -> dict[str, Any]:
    scenes = crossing(frames)
    images = [scene.image for scene in scenes]
    still = [scenes[0].face] * frames
    crossing_streams = paired_streams(off, on, source, images)
    still_streams = paired_streams(off, on, source, still)
    if on.hands is None:
        raise ValueError("the `on` pipeline has no occlusion stage")
    middle = scenes[len(scenes) // 2]  # the hand over the face
    parts = look_costs(on.hands, middle, on.detector.process([middle.face])[0][0])
    outputs = zip(scenes, crossing_streams.off, crossing_streams.on, strict=True)
    scores = [s for s in (score(sc, a, b) for sc, a, b in outputs) if s is not None]

    def mean(values: list[float]) -> float:
        return round(float(np.mean(values)), 4) if values else 0.0

    return {
        "frames": frames,
        "frames_with_hand_over_face": len(scores),
        "hand_kept": mean([s.hand_kept for s in scores]),
        "hand_kept_min": round(min((s.hand_kept for s in scores), default=0.0), 4),
        "iou": mean([s.iou for s in scores]),
        "face_swapped": mean([s.face_swapped for s in scores]),
        # one face per frame: the stage's time per frame is its time per face
        "occlusion_ms_per_face": percentiles_ms(crossing_streams.timer.samples.get("occlusion", [])),
        "occlusion_ms_per_face_no_hand": percentiles_ms(still_streams.timer.samples.get("occlusion", [])),
        "occlusion_cpu_ms_per_face": percentiles_ms(crossing_streams.timer.samples.get("occlusion_cpu", [])),
        "occlusion_cpu_ms_per_face_no_hand": percentiles_ms(still_streams.timer.samples.get("occlusion_cpu", [])),
        **parts,
        "frame_ms_off": percentiles_ms(crossing_streams.off_seconds),
        "frame_ms_on": percentiles_ms(crossing_streams.on_seconds),
        "fps_ratio_on_off": _fps_ratio(crossing_streams),
        "fps_ratio_on_off_no_hand": _fps_ratio(still_streams),
    }
