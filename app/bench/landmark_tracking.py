"""How well dense landmarks followed from frame to frame (app.pipeline.mesh_track) hold up against landmarks
found afresh on every frame, on a real face moved by a known motion (`app.media.clips.make_motion_clip`).

- fresh: every frame detected, its mesh found on a crop framed by the (Kalman-smoothed) detection;
- predicted: every `detect_interval`-th frame detected, the mesh found on a crop framed by the box tracker's
  prediction in between (the path without landmark tracking);
- tracked: every `detect_interval`-th frame detected, the mesh found on a crop framed by the face's previous
  mesh.

The still's true mesh is unknown; per run, the median of its meshes mapped back onto the still estimates it
(as the tracker's tests do), so what is measured is how far each frame's mesh strays from the known motion:
`error` is the mean point distance, `jitter` the mean frame-to-frame change of that stray (a steady offset
costs no jitter), both in the face's eye distances. `offset_to_fresh` is how far a run's still mesh lies from
the fresh run's: the model places points a little differently on differently framed crops, and neither is
the truth.
"""

from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from app.media.clips import MotionClip
from app.pipeline.align import transform_points
from app.pipeline.landmarks import FaceMeshLandmarker, Mesh, five_points
from app.pipeline.mesh_track import MeshTrackConfig, MeshTracking, eye_distance
from app.pipeline.track import FaceTracker, TrackerConfig
from app.pipeline.types import Face


@dataclass
class LandmarkRun:
    meshes: list[Mesh | None]
    detected_frames: int


def run_meshes(
    landmarker: FaceMeshLandmarker,
    clip: MotionClip,
    detections: list[list[Face]],
    *,
    detect_interval: int,
    chained: bool,
) -> LandmarkRun:
    """The first face's mesh in every frame of `clip`, detections used only when the tracker asks."""
    tracker = FaceTracker(TrackerConfig(detect_interval=detect_interval))
    # Unchained runs frame every crop from the tracker's points in one pass: a chain's settling passes on its first
    # frame would make each of their frames a short chain.
    config = MeshTrackConfig() if chained else MeshTrackConfig(settle_passes=0)
    tracking = MeshTracking(landmarker, config)
    meshes: list[Mesh | None] = []
    detected = 0
    for frame, found in zip(clip.frames, detections, strict=True):
        due = tracker.due()
        detected += due
        faces = tracker.update(found if due else None)
        if not chained:
            tracking = MeshTracking(landmarker, config)
        _, frame_meshes = tracking.follow([frame], [faces[:1]])
        if tracking.collapsed:
            tracker.request_detection()
        meshes.append(frame_meshes[0][0] if frame_meshes[0] else None)
    return LandmarkRun(meshes, detected)


def still_mesh(clip: MotionClip, meshes: list[Mesh | None]) -> np.ndarray:
    """The median of every frame's mesh mapped back onto the still."""
    back = [
        transform_points(mesh[:, :2], cv2.invertAffineTransform(matrix))
        for mesh, matrix in zip(meshes, clip.matrices, strict=True)
        if mesh is not None
    ]
    return np.median(np.stack(back), axis=0)


def stray(clip: MotionClip, truth: np.ndarray, meshes: list[Mesh | None]) -> np.ndarray:
    """Per frame: every point's offset from the known motion, in eye distances ([frames, 468, 2]; NaN where
    no mesh was found)."""
    out = np.full((len(meshes), len(truth), 2), np.nan)
    for i, mesh in enumerate(meshes):
        if mesh is None:
            continue
        expected = clip.map_points(i, truth)
        out[i] = (mesh[:, :2] - expected) / eye_distance(five_points(expected))
    return out


def summarize(offsets: np.ndarray, detected_frames: int) -> dict[str, Any]:
    found = ~np.isnan(offsets[:, 0, 0])
    error = np.linalg.norm(offsets, axis=2).mean(axis=1)
    change = np.linalg.norm(np.diff(offsets, axis=0), axis=2).mean(axis=1)
    return {
        "frames": len(offsets),
        "frames_with_landmarks": int(found.sum()),
        "detected_frames": detected_frames,
        "error_mean": round(float(np.nanmean(error)), 4),
        "error_p95": round(float(np.nanpercentile(error, 95)), 4),
        "jitter_mean": round(float(np.nanmean(change)), 4),
    }


def compare(
    landmarker: FaceMeshLandmarker, clip: MotionClip, detections: list[list[Face]], detect_interval: int = 3
) -> dict[str, Any]:
    """Fresh landmarks on every detected frame against landmarks tracked between detections."""
    runs = {
        "fresh": run_meshes(landmarker, clip, detections, detect_interval=1, chained=False),
        "predicted": run_meshes(landmarker, clip, detections, detect_interval=detect_interval, chained=False),
        "tracked": run_meshes(landmarker, clip, detections, detect_interval=detect_interval, chained=True),
    }
    truths = {name: still_mesh(clip, run.meshes) for name, run in runs.items()}
    scale = eye_distance(five_points(truths["fresh"]))
    out: dict[str, Any] = {}
    for name, run in runs.items():
        offset = float(np.linalg.norm(truths[name] - truths["fresh"], axis=1).mean()) / scale
        out[name] = {
            **summarize(stray(clip, truths[name], run.meshes), run.detected_frames),
            "offset_to_fresh": round(offset, 4),
        }
    return out
