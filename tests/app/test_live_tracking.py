"""Live streams detect in the background: no frame waits for the detector, and its faces are fused when
they arrive (the real detector on a real face moving through a clip)."""

import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

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


def test_frames_never_wait_for_detection_and_its_faces_are_fused(
    detector: RetinaFaceDetector, astronaut: Image
) -> None:
    (faces,) = detector.process([astronaut])
    clip = make_motion_clip(astronaut, size=(320, 240), frames=12, focus=tuple(faces[0].landmarks.mean(axis=0)))
    gated = GatedDetector(detector)
    with ThreadPoolExecutor(1) as executor:
        live = LiveTracking(FaceTracker(TrackerConfig(detect_interval=4)), gated, executor)
        timer = StageTimer()
        # The detector is held: frames go on being located (nothing found yet), one detection in flight.
        for frame in clip.frames[:3]:
            assert live.locate(frame, timer) == []
        assert gated.calls == 1
        gated.gate.set()
        pending = live.in_flight
        assert pending is not None
        pending.result(30)
        (face,) = live.locate(clip.frames[3], timer)  # fused on the first frame after it arrived
        assert face.status == "seen"
        located = [live.locate(frame, timer) for frame in clip.frames[4:]]
        assert all(len(found) == 1 and found[0].track_id == face.track_id for found in located)
        # Later detections were started (every 4th frame) while frames went on; a detection's time is
        # reported when it arrives, apart from the frames' own stages.
        later = live.in_flight
        if later is not None:
            later.result(30)
        assert gated.calls >= 2
        assert len(timer.samples[BACKGROUND_DETECT]) >= 1
        assert "detect" not in timer.samples
        box = np.array(located[-1][0].box)
        mapped = clip.map_points(len(clip) - 1, faces[0].landmarks).mean(axis=0)
        assert box[0] < mapped[0] < box[2] and box[1] < mapped[1] < box[3]
        live.close()
