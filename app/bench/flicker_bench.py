"""Temporal stability of the swapped face: flicker, landmark jitter and lag, on clips with known motion.

No video of a real person ships in a package, so the clips move a real photo (the astronaut) through a virtual
camera (app.media.clips.make_motion_clip) with camera noise, which gives the true landmark positions of every
frame:

- ``still``: the head does not move; only the sensor noise changes between frames;
- ``slow``: a slow pan, zoom and roll;
- ``fast``: a fast pan (for the lag of any smoothing);
- ``near_still``: a head held still before a webcam, as a file brings it: the camera wanders a fraction of a
  pixel per frame (a random walk) and zooms by a fraction of a percent, and the clip goes through H.264 at
  CRF 12 and back (the codec's own frame-to-frame changes on top of the sensor noise).

Per clip and engine:

- flicker ratio: the mean absolute frame-to-frame change of the output's face region over the input's own
  change there (1.0: the swap adds no flicker; the face region is the true face box, moved with the camera);
- landmark jitter: the RMS frame-to-frame change of the five face points' error against the truth, in pixels
  (steady bias left out: what the eye sees as shake);
- lag: the frame shift that best lines the points' path up with the true path once their steady offset is
  taken out (0: no lag; not looked for on the still clip), and their mean error in pixels.
"""

from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from app.media.clips import MotionClip, load_sample, make_motion_clip, through_h264
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.pipeline.timing import StageTimer
from app.pipeline.types import Image

NOISE_SIGMA = 2.0  # camera noise, grey levels: what makes a still head's frames differ
MAX_LAG = 4  # frames searched for the best-fitting lag


@dataclass(frozen=True)
class ClipSpec:
    name: str
    frames: int
    pan_px: float
    zoom: float
    rotate_deg: float
    drift_px: float = 0.0  # the camera's random walk: each frame's step, standard deviation in pixels
    crf: int | None = None  # through H.264 at this CRF and back (None: the frames as made)


NEAR_STILL = ClipSpec("near_still", 45, 0.0, 0.002, 0.0, drift_px=0.03, crf=12)
CLIPS = (
    ClipSpec("still", 45, 0.0, 0.0, 0.0),
    ClipSpec("slow", 90, 16.0, 0.06, 3.0),
    ClipSpec("fast", 30, 90.0, 0.0, 0.0),
    NEAR_STILL,
)


@dataclass
class FlickerRow:
    engine: str
    clip: str
    frames: int
    flicker_ratio: float
    jitter_px: float
    lag_frames: int
    mean_error_px: float
    ms_per_frame: float


def face_clip(spec: ClipSpec, size: tuple[int, int] = (640, 480)) -> tuple[MotionClip, np.ndarray, np.ndarray]:
    """The clip of the astronaut's face, the face box's corners and its five points in the still."""
    still = load_sample("astronaut")
    box = np.array([[178.0, 58.0], [274.0, 58.0], [274.0, 178.0], [178.0, 178.0]])  # as RetinaFace places it
    centre = box.mean(axis=0)
    clip = make_motion_clip(
        still,
        size=size,
        frames=spec.frames,
        pan_px=spec.pan_px,
        zoom=spec.zoom,
        rotate_deg=spec.rotate_deg,
        drift_px=spec.drift_px,
        noise_sigma=NOISE_SIGMA,
        focus=(float(centre[0]), float(centre[1])),
    )
    return (clip if spec.crf is None else through_h264(clip, spec.crf)), box, still


def _region(clip: MotionClip, index: int, box: np.ndarray) -> tuple[slice, slice]:
    corners = clip.map_points(index, box)
    x0, y0 = np.floor(corners.min(axis=0)).astype(int)
    x1, y1 = np.ceil(corners.max(axis=0)).astype(int)
    w, h = clip.size
    return slice(max(0, y0), min(h, y1)), slice(max(0, x0), min(w, x1))


def flicker_ratio(inputs: list[Image], outputs: list[Image], regions: list[tuple[slice, slice]]) -> float:
    """Sum over frames of the output region's mean change over the input region's (same region both times)."""
    out_change = in_change = 0.0
    for t in range(1, len(inputs)):
        rows, cols = regions[t]
        out_change += float(np.abs(outputs[t][rows, cols].astype(np.int16) - outputs[t - 1][rows, cols]).mean())
        in_change += float(np.abs(inputs[t][rows, cols].astype(np.int16) - inputs[t - 1][rows, cols]).mean())
    return out_change / max(in_change, 1e-9)


def path_figures(found: np.ndarray, truth: np.ndarray) -> tuple[float, int, float]:
    """(jitter px, lag frames, mean error px) of found points [T,5,2] against the true ones."""
    error = found - truth
    steps = np.diff(error, axis=0)
    jitter = float(np.sqrt((steps**2).sum(axis=2).mean())) if len(steps) else 0.0
    centres, true_centres = found.mean(axis=1), truth.mean(axis=1)
    centres = centres - (centres - true_centres).mean(axis=0)  # a steady offset is no lag
    best, best_lag = np.inf, 0
    moving = float(np.linalg.norm(np.diff(true_centres, axis=0), axis=1).max(initial=0.0)) > 0.5
    for lag in range(0, min(MAX_LAG, len(found) - 2) + 1 if moving else 1):
        gap = float(np.linalg.norm(centres[lag:] - true_centres[: len(found) - lag], axis=1).mean())
        if gap < best - 1e-6:
            best, best_lag = gap, lag
    return jitter, best_lag, float(np.linalg.norm(error, axis=2).mean())


def run_clip(
    engine: str,
    pipeline: FramePipeline,
    source: PreparedSource,
    spec: ClipSpec,
    truth_points: np.ndarray,
    clock: Callable[[], float],
) -> tuple[FlickerRow, list[Image]]:
    """One engine over one clip, as a stream (tracker and landmark chains carried from frame to frame)."""
    clip, box, _ = face_clip(spec)
    tracker = pipeline.new_stream()
    outputs: list[Image] = []
    found: list[np.ndarray] = []
    truth: list[np.ndarray] = []
    start = clock()
    for index, frame in enumerate(clip.frames):
        (result,) = pipeline.process([frame], source, tracker, StageTimer())
        outputs.append(result.image)
        if result.faces:
            found.append(np.asarray(result.faces[0].landmarks, np.float64))
            truth.append(clip.map_points(index, truth_points))
    elapsed = clock() - start
    regions = [_region(clip, i, box) for i in range(len(clip))]
    jitter, lag, error = path_figures(np.asarray(found), np.asarray(truth)) if len(found) > 2 else (0.0, 0, 0.0)
    row = FlickerRow(
        engine=engine,
        clip=spec.name,
        frames=len(clip),
        flicker_ratio=round(flicker_ratio(clip.frames, outputs, regions), 3),
        jitter_px=round(jitter, 3),
        lag_frames=lag,
        mean_error_px=round(error, 3),
        ms_per_frame=round(elapsed * 1000 / len(clip), 2),
    )
    return row, outputs


def rows_as_dicts(rows: list[FlickerRow]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]
