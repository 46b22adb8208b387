"""Is the real face ever shown? A clip made from a real photo that makes a detector lose the face, and a count
of the output frames where the face shows unswapped.

The clip (`face_lost_clip`) moves a still photo's face through a frame along a known path: steady, then a
hand (a flat patch) slides over most of it, then it moves fast (a third of its width a frame at the peak), then it
turns (the face is squeezed sideways to 45 % of its width while it rolls 25°: a photo cannot turn in depth,
this is the 2-D shadow of a head turn), then it leaves the frame on the right, stays out, and comes back.
Because every frame's affine matrix from the still is known, so is the face's region in every frame.

Counting (`count_revealed`): the face's core is the hull of its five landmarks on the still (eyes, nose,
mouth corners) grown by 40 % about its centre, mapped into each frame. A frame *shows a face* when at least
30 % of that core is inside the frame and not under the hand. It *reveals* the face when more than half of
the core's visible pixels come out of the pipeline as they went in (every channel within 3 grey levels):
the swap changes nearly all of them (classic engine, another identity), covering changes all of them.
"""

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from app.names import FaceLostPolicy
from app.pipeline.types import Face, Image, Matrix

CORE_GROWTH = 1.4
VISIBLE_FRACTION = 0.3  # of the whole core, inside the frame and not occluded, for a frame to show a face
UNCHANGED_LEVELS = 3  # a pixel within this many grey levels of the input (every channel) is unchanged
REVEAL_FRACTION = 0.5  # of the visible core unchanged: the real face shows
BACKGROUND = 96  # grey level outside the photo


@dataclass
class FaceLostClip:
    frames: list[Image]
    matrices: list[Matrix]  # still -> frame, per frame
    occluders: list[tuple[int, int, int, int] | None]  # the hand's box per frame (x0, y0, x1, y1)
    core: npt.NDArray[np.float64]  # the face's core polygon on the still (N x 2)
    segments: dict[str, tuple[int, int]]  # name -> [start, end) frame indices


def _linear(scale_x: float, scale_y: float, angle_deg: float) -> npt.NDArray[np.float64]:
    a = np.deg2rad(angle_deg)
    rotation = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
    return rotation @ np.diag([scale_x, scale_y])


def face_lost_clip(
    still: Image, face: Face, *, size: tuple[int, int] = (640, 480), face_width: float = 150.0
) -> FaceLostClip:
    """The clip for the face `face` found on `still` (30 fps, 150 frames: 5 s)."""
    width, height = size
    centre_still = face.landmarks.astype(np.float64).mean(axis=0)
    scale = face_width / float(face.box[2] - face.box[0])
    home = np.array([width / 2, height / 2])
    segments = {"steady": (0, 20), "occluded": (20, 45), "fast": (45, 70), "turn": (70, 95), "leave": (95, 135)}
    segments["steady_again"] = (135, 150)
    frames: list[Image] = []
    matrices: list[Matrix] = []
    occluders: list[tuple[int, int, int, int] | None] = []
    for i in range(150):
        centre, squeeze, roll = home.copy(), 1.0, 0.0
        occluder: tuple[int, int, int, int] | None = None
        if segments["occluded"][0] <= i < segments["occluded"][1]:
            # A hand rises from below over the mouth, nose and eyes (up to 80 % of the face's height), then drops.
            t = (i - 20) / 24
            cover = 0.8 * np.sin(np.pi * t)
            half = face_width * 0.75
            top = home[1] + half - cover * 2 * half
            occluder = (int(home[0] - half), int(top), int(home[0] + half), height)
        elif segments["fast"][0] <= i < segments["fast"][1]:
            centre[0] += 1.33 * face_width * np.sin(2 * np.pi * (i - 45) / 25)
        elif segments["turn"][0] <= i < segments["turn"][1]:
            s = np.sin(np.pi * (i - 70) / 25)
            squeeze, roll = 1.0 - 0.55 * s, 25.0 * s
        elif segments["leave"][0] <= i < segments["leave"][1]:
            k = i - 95  # 10 frames out to the right, 10 out of view, 10 back, 10 still
            away = width / 2 + face_width * 1.5
            out = min(1.0, k / 10) if k < 20 else max(0.0, 1.0 - (k - 20) / 10)
            centre[0] += away * out
        linear = scale * _linear(squeeze, 1.0, roll)
        matrix = np.hstack([linear, (centre - linear @ centre_still)[:, None]])
        frame = cv2.warpAffine(
            still, matrix, size, flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=(BACKGROUND,) * 3
        )
        if occluder is not None:
            x0, y0, x1, y1 = occluder
            frame[max(0, y0) : y1, max(0, x0) : x1] = (80, 110, 160)  # a skin-toned flat hand
        frames.append(np.ascontiguousarray(frame, dtype=np.uint8))
        matrices.append(matrix)
        occluders.append(occluder)
    points = face.landmarks.astype(np.float64)
    hull = cv2.convexHull(points.astype(np.float32)).reshape(-1, 2).astype(np.float64)
    mid = points.mean(axis=0)
    core = mid + CORE_GROWTH * (hull - mid)
    return FaceLostClip(frames, matrices, occluders, core, segments)


def _core_masks(clip: FaceLostClip, index: int) -> tuple[np.ndarray, float]:
    """The face core's visible pixels in frame `index`, and the core's whole area (in or out of the frame)."""
    height, width = clip.frames[index].shape[:2]
    m = clip.matrices[index]
    polygon = clip.core @ m[:, :2].T + m[:, 2]
    area = float(cv2.contourArea(polygon.astype(np.float32)))
    mask = np.zeros((height, width), np.uint8)
    cv2.fillPoly(mask, [np.round(polygon).astype(np.int32)], 1)
    occluder = clip.occluders[index]
    if occluder is not None:
        x0, y0, x1, y1 = occluder
        mask[max(0, y0) : y1, max(0, x0) : x1] = 0
    return mask.astype(bool), area


def count_revealed(clip: FaceLostClip, outputs: list[Image]) -> dict[str, Any]:
    """Frames that show a face, frames whose output reveals it unswapped (with their indices), per segment."""
    shown = 0
    revealed: list[int] = []
    unchanged_fractions: list[float] = []
    for i, (before, after) in enumerate(zip(clip.frames, outputs, strict=True)):
        visible, area = _core_masks(clip, i)
        count = int(visible.sum())
        if area <= 0 or count < VISIBLE_FRACTION * area:
            continue
        shown += 1
        diff = np.abs(after.astype(np.int16) - before.astype(np.int16)).max(axis=2)
        unchanged = float((diff[visible] <= UNCHANGED_LEVELS).mean())
        unchanged_fractions.append(unchanged)
        if unchanged > REVEAL_FRACTION:
            revealed.append(i)
    by_segment = {
        name: sum(start <= i < end for i in revealed) for name, (start, end) in clip.segments.items()
    }  # fmt: skip
    return {
        "frames": len(outputs),
        "frames_showing_a_face": shown,
        "revealed_frames": len(revealed),
        "revealed_by_segment": by_segment,
        "revealed_indices": revealed,
        "unchanged_fraction_max": round(max(unchanged_fractions, default=0.0), 3),
    }


def run_paced(
    detector: Any,
    clip: FaceLostClip,
    policy: FaceLostPolicy,
    *,
    fps: float = 30.0,
    detect_interval: int = 3,
    hold_frames: int = 4,
) -> dict[str, Any]:
    """The clip through a live stream (detection in the background, app.pipeline.live), its frames arriving
    at `fps` as from a camera, classic engine swapping tom_hanks in: revealed-frame counts, and how many
    detections ran inline (the frame waited) and in the background."""
    import time

    from app.media.clips import load_sample
    from app.pipeline.live import BACKGROUND_DETECT
    from app.pipeline.paste import PasteConfig
    from app.pipeline.pipeline import FramePipeline, PipelineConfig
    from app.pipeline.swap import ClassicEngine
    from app.pipeline.timing import StageTimer
    from app.pipeline.track import TrackerConfig

    config = PipelineConfig(
        tracker=TrackerConfig(on_face_lost=policy, hold_frames=hold_frames),
        paste=PasteConfig(mask="ellipse"),
        live_detect_background=True,
        live_detect_interval=detect_interval,
    )
    pipeline = FramePipeline(detector, ClassicEngine(), config=config)
    source = pipeline.prepare_source(load_sample("tom_hanks"))
    live = pipeline.new_live_stream()
    timer = StageTimer()
    outputs: list[Image] = []
    started = time.monotonic()
    try:
        for index, frame in enumerate(clip.frames):
            wait = started + index / fps - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            outputs.append(pipeline.process_live(frame, source, live, timer, "paced").image)
    finally:
        live.close()
    return {
        **count_revealed(clip, outputs),
        "detections_inline": len(timer.samples.get("detect", [])),
        "detections_background": len(timer.samples.get(BACKGROUND_DETECT, [])),
    }


def run_face_lost_bench(
    policies: tuple[FaceLostPolicy, ...] = ("hold", "cover", "pass"),
    detect_intervals: tuple[int, ...] = (1, 3),
    size: tuple[int, int] = (640, 480),
) -> dict[str, Any]:
    """Revealed-frame counts of the clip for each policy and detection interval, with the server's detector
    (the store and detector settings of `PipelineSettings`) and the classic engine swapping another identity
    (tom_hanks onto the astronaut)."""
    from dataclasses import replace

    from app.media.clips import load_sample
    from app.model_store import open_model_store
    from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
    from app.pipeline.factory import load_model
    from app.pipeline.paste import PasteConfig
    from app.pipeline.pipeline import FramePipeline, PipelineConfig
    from app.pipeline.swap import ClassicEngine
    from app.pipeline.track import TrackerConfig
    from app.settings import PipelineSettings

    settings = PipelineSettings()
    store = open_model_store()
    detector = RetinaFaceDetector(
        load_model(store, settings.detector_model, settings),
        DetectorConfig(
            size=settings.detect_size,
            score_threshold=settings.detect_threshold,
            refine_landmarks=settings.refine_landmarks,
        ),
    )
    try:
        still = load_sample("astronaut")
        (faces,) = detector.process([still])
        if not faces:
            raise RuntimeError("no face found on the astronaut photo")
        clip = face_lost_clip(still, faces[0], size=size, face_width=150.0 * size[0] / 640)
        source_photo = load_sample("tom_hanks")
        rows: list[dict[str, Any]] = []
        for interval in detect_intervals:
            for policy in policies:
                tracker_config = replace(
                    TrackerConfig(), detect_interval=interval, on_face_lost=policy, hold_frames=settings.hold_frames
                )
                config = PipelineConfig(tracker=tracker_config, paste=PasteConfig(mask="ellipse"))
                pipeline = FramePipeline(detector, ClassicEngine(), config=config)
                source = pipeline.prepare_source(source_photo)
                tracker = pipeline.new_stream()
                outputs = [pipeline.process([frame], source, tracker)[0].image for frame in clip.frames]
                counts = count_revealed(clip, outputs)
                rows.append({"policy": policy, "detect_interval": interval, **counts})
        # Live sessions: detection in the background at the live detector's size, frames paced at 30 fps as
        # a camera sends them.
        live_detector = RetinaFaceDetector(
            detector.model, replace(detector.config, canvas="fixed", size=settings.live_detect_size)
        )
        for policy in policies:
            if policy != "pass":
                counts = run_paced(live_detector, clip, policy, hold_frames=settings.hold_frames)
                rows.append({"policy": policy, "detect_interval": "live_background", **counts})
        return {"clip": {"size": list(size), "frames": len(clip.frames), "segments": clip.segments}, "rows": rows}
    finally:
        detector.close()
