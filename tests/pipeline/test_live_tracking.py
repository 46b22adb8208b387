"""Live streams detect in the background: no frame waits for the detector, and its faces are fused when
they arrive (the real detector on a real face moving through a clip)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from app.media.clips import make_motion_clip
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.live import BACKGROUND_DETECT, LiveTracking
from app.pipeline.stage import DEFAULT_SESSION
from app.pipeline.timing import StageTimer
from app.pipeline.track import FaceTracker, TrackerConfig
from app.pipeline.types import Face, Image


class GatedDetector:
    """The real detector, held at a gate the test opens: shows who waits for it."""

    name = "detect"

    def __init__(self, detector: RetinaFaceDetector) -> None:
        self.detector = detector
        self.gate = threading.Event()
        self.calls = 0

    def process(self, batch: list[Image], *, session: str = DEFAULT_SESSION) -> list[list[Face]]:
        self.calls += 1
        assert self.gate.wait(30)
        return self.detector.process(batch)

    def close(self) -> None:
        pass


def test_frames_never_wait_for_scheduled_detection_and_its_faces_are_fused(
    detector: RetinaFaceDetector, astronaut: Image
) -> None:
    (faces,) = detector.process([astronaut])
    focus = tuple(faces[0].landmarks.mean(axis=0))
    # A slow drift: no face region changes at once, so only the schedule (every 4th frame) calls for detection.
    clip = make_motion_clip(astronaut, size=(320, 240), frames=12, pan_px=3, zoom=0.0, rotate_deg=0.0, focus=focus)
    gated = GatedDetector(detector)
    with ThreadPoolExecutor(1) as executor:
        live = LiveTracking(FaceTracker(TrackerConfig(detect_interval=4)), gated, executor)
        timer = StageTimer()
        # With no face tracked yet, the first frame waits for its detection: the face is swapped at once.
        gated.gate.set()
        (first,) = live.locate(clip.frames[0], timer)
        assert first.status == "seen" and len(timer.samples["detect"]) == 1
        gated.gate.clear()
        # With a face tracked and the detector held, frames 1-6 are located without waiting; frame 4 started
        # a detection in the background.
        for frame in clip.frames[1:7]:
            assert [f.track_id for f in live.locate(frame, timer)] == [first.track_id]
        pending = live.in_flight
        assert pending is not None
        gated.gate.set()
        pending.result(30)
        (face,) = live.locate(clip.frames[7], timer)  # fused on the first frame after it arrived
        assert face.status == "seen" and face.track_id == first.track_id and live.in_flight is None
        assert len(timer.samples[BACKGROUND_DETECT]) == 1 and len(timer.samples["detect"]) == 1
        located = [live.locate(frame, timer) for frame in clip.frames[8:]]
        assert all(len(found) == 1 and found[0].track_id == face.track_id for found in located)
        box = np.array(located[-1][0].box)
        mapped = clip.map_points(len(clip) - 1, faces[0].landmarks).mean(axis=0)
        assert box[0] < mapped[0] < box[2] and box[1] < mapped[1] < box[3]
        live.close()


def test_a_face_that_jumps_is_detected_before_its_frame_is_used(detector: RetinaFaceDetector, astronaut: Image) -> None:
    (faces,) = detector.process([astronaut])
    clip = make_motion_clip(astronaut, size=(320, 240), frames=2, pan_px=0, zoom=0.0, rotate_deg=0.0)
    with ThreadPoolExecutor(1) as executor:
        live = LiveTracking(FaceTracker(TrackerConfig(detect_interval=30)), detector, executor)
        timer = StageTimer()
        (before,) = live.locate(clip.frames[0], timer)
        jumped = np.roll(clip.frames[1], 60, axis=1)  # the camera jerks 60 px to the right
        (after,) = live.locate(jumped, timer)
        assert len(timer.samples["detect"]) == 2  # the frame waited: a stale position would show the face
        assert float(after.box[0] - before.box[0]) == pytest.approx(60, abs=6)


def _moved(face: Face, dx: float) -> Face:
    shift = np.array([dx, 0.0], np.float32)
    return Face(box=face.box + np.tile(shift, 2), score=face.score, landmarks=face.landmarks + shift)


@pytest.mark.parametrize(("step", "waits"), [(20.0, True), (0.0, False)])
def test_a_fast_face_waits_for_its_detection_a_still_one_does_not(
    detector: RetinaFaceDetector, astronaut: Image, step: float, waits: bool
) -> None:
    """A face moving fast is detected before its frame is used: its prediction from late background results
    overshot a face that stopped (the face-lost clip revealed it in up to 11 of 122 paced frames)."""
    (faces,) = detector.process([astronaut])
    face = faces[0]
    tracker = FaceTracker(TrackerConfig(detect_interval=30))
    for i in range(4):  # not due by schedule on the next frame; no look kept, so only the motion can call
        tracker.update([_moved(face, step * i)])
    assert tracker.unsure() is waits
    with ThreadPoolExecutor(1) as executor:
        live = LiveTracking(tracker, detector, executor)
        timer = StageTimer()
        live.locate(astronaut, timer)
        assert len(timer.samples.get("detect", [])) == (1 if waits else 0)
        assert live.in_flight is None
        live.close()


def _tracking_from(detector: RetinaFaceDetector, frame: Image) -> FaceTracker:
    """A tracker that has seen the face of `frame` once (no motion known yet) and kept its look."""
    tracker = FaceTracker(TrackerConfig(detect_interval=30))
    (found,) = detector.process([frame])
    tracker.update(found)
    tracker.note_looks(frame)
    return tracker


def test_a_face_moving_smoothly_between_frames_far_apart_is_not_detected_again(
    detector: RetinaFaceDetector, astronaut: Image
) -> None:
    """A loaded server skips frames, so the face moves several frames' worth between the frames it works on:
    its region changes by more grey levels than a hand over it would in one frame, yet the prediction is
    still good. Compared with its region's own shift undone, it is not detected again (before, every such
    frame waited for a detection, which made the server slower still)."""
    (faces,) = detector.process([astronaut])
    focus = tuple(faces[0].landmarks.mean(axis=0))
    # The server benchmark's camera motion (pan, zoom, roll), with three frames of four skipped.
    clip = make_motion_clip(astronaut, size=(640, 480), frames=60, focus=focus, seed=3)
    skipped = [(i, i + 4) for i in range(0, 56, 8)]
    for before, after in skipped:
        tracker = _tracking_from(detector, clip.frames[before])
        assert not tracker.looks_changed(clip.frames[after]), (before, after)
    # Something crossing the face, or a jump, still calls for detection in the same frames.
    before, after = skipped[2]
    tracker = _tracking_from(detector, clip.frames[before])
    x0, y0, x1, y1 = (int(v) for v in faces_in(detector, clip.frames[before]))
    covered = clip.frames[after].copy()
    covered[y1 - (y1 - y0) // 3 : y1, x0:x1] = (80, 110, 160)  # a hand over the mouth and chin
    assert tracker.looks_changed(covered)
    assert tracker.looks_changed(np.roll(clip.frames[after], 40, axis=1))


def faces_in(detector: RetinaFaceDetector, frame: Image) -> np.ndarray:
    (found,) = detector.process([frame])
    return found[0].box


def test_frames_that_wait_for_detection_are_counted_by_reason(detector: RetinaFaceDetector, astronaut: Image) -> None:
    clip = make_motion_clip(astronaut, size=(320, 240), frames=3, pan_px=0, zoom=0.0, rotate_deg=0.0)
    with ThreadPoolExecutor(1) as executor:
        live = LiveTracking(FaceTracker(TrackerConfig(detect_interval=2)), detector, executor)
        timer = StageTimer()
        live.locate(clip.frames[0], timer)  # no face tracked yet
        live.locate(np.roll(clip.frames[1], 60, axis=1), timer)  # the camera jerked
        live.locate(np.roll(clip.frames[2], 60, axis=1), timer)  # still: due by schedule, in the background
        assert live.in_flight is not None
        live.in_flight.result(30)
        live.close()
    assert dict(live.detections) == {"new": 1, "missed": 0, "fast": 0, "looks": 1, "background": 1}
