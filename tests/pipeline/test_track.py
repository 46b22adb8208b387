"""Tracking and landmark smoothing on a real face moved by a known motion, plus entry/exit logic."""

import cv2
import numpy as np
import pytest

from app.media.clips import MotionClip, make_motion_clip
from app.pipeline.align import transform_points
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.track import FaceTracker, TrackerConfig
from app.pipeline.types import Face, Image


@pytest.fixture(scope="module")
def moving_face(detector: RetinaFaceDetector, astronaut: Image) -> tuple[MotionClip, list[list[Face]], np.ndarray]:
    (faces,) = detector.process([astronaut])
    centre = tuple(faces[0].landmarks.mean(axis=0))
    clip = make_motion_clip(
        astronaut, size=(640, 480), frames=90, pan_px=30, zoom=0.1, rotate_deg=3.0, noise_sigma=8.0, seed=3,
        focus=centre,
    )  # fmt: skip
    detections = detector.process(clip.frames)
    # The still's exact landmarks are unknown; the median of every frame's detection mapped back onto
    # the still estimates them, so what is measured below is tracking error, not the detector's offset.
    back = [
        transform_points(found[0].landmarks, cv2.invertAffineTransform(matrix))
        for found, matrix in zip(detections, clip.matrices, strict=True)
    ]
    return clip, detections, np.median(np.stack(back), axis=0)


def errors(clip: MotionClip, truth: np.ndarray, tracked: list[list[Face]]) -> np.ndarray:
    return np.array(
        [
            np.linalg.norm(faces[0].landmarks - clip.map_points(i, truth), axis=1).mean()
            for i, faces in enumerate(tracked)
        ]
    )


@pytest.mark.slow
def test_smoothed_landmarks_stay_close_to_the_known_motion(moving_face) -> None:  # type: ignore[no-untyped-def]
    clip, detections, truth = moving_face
    tracker = FaceTracker()
    tracked = [tracker.update(found) for found in detections]
    assert all(len(faces) == 1 for faces in tracked)
    assert len({faces[0].track_id for faces in tracked}) == 1
    error = errors(clip, truth, tracked)
    assert error.mean() <= 1.0 and np.percentile(error, 95) <= 1.5, (error.mean(), np.percentile(error, 95))
    # Smoothing removes frame-to-frame jitter that the raw detections have.
    raw = errors(clip, truth, detections)
    assert np.abs(np.diff(error)).mean() < np.abs(np.diff(raw)).mean()


def test_frames_between_detections_follow_the_motion(moving_face) -> None:  # type: ignore[no-untyped-def]
    clip, detections, truth = moving_face
    tracker = FaceTracker(TrackerConfig(detect_interval=3))
    tracked = []
    detected_frames = 0
    for found in detections:
        due = tracker.due()
        detected_frames += due
        tracked.append(tracker.update(found if due else None))
    assert detected_frames == 30
    assert errors(clip, truth, tracked).mean() <= 2.0


def face_at(x: float, y: float, size: float = 100.0) -> Face:
    box = np.array([x, y, x + size, y + size], np.float32)
    unit = np.array([[0.3, 0.4], [0.7, 0.4], [0.5, 0.6], [0.35, 0.8], [0.65, 0.8]], np.float32)
    return Face(box=box, score=0.99, landmarks=unit * size + np.array([x, y], np.float32))


def test_faces_entering_and_leaving_with_pass() -> None:
    """With `pass` a face missed by a detection round is dropped at once (the other policies cover it:
    tests/app/test_face_lost.py)."""
    tracker = FaceTracker(TrackerConfig(max_missed=2, on_face_lost="pass"))
    first = tracker.update([face_at(10, 10)])
    assert [f.track_id for f in first] == [0]
    both = tracker.update([face_at(12, 10), face_at(300, 50)])
    assert sorted(f.track_id for f in both) == [0, 1]
    # The second face leaves: it is no longer swapped at once.
    assert [f.track_id for f in tracker.update([face_at(14, 10)])] == [0]
    # It comes back soon after: same track.
    assert sorted(f.track_id for f in tracker.update([face_at(16, 10), face_at(302, 50)])) == [0, 1]
    # Both leave for longer than max_missed rounds: tracks end, and a face there later is new.
    for _ in range(3):
        assert tracker.update([]) == []
    assert [f.track_id for f in tracker.update([face_at(16, 10)])] == [2]


def test_between_detections_faces_are_reused() -> None:
    tracker = FaceTracker(TrackerConfig(detect_interval=4))
    assert tracker.due()
    tracker.update([face_at(50, 50)])
    for _ in range(3):
        assert not tracker.due()
        assert [f.track_id for f in tracker.update(None)] == [0]
    assert tracker.due()
