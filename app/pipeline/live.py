"""Live video: detection off the frame's critical path.

Every frame is tracked (the tracker predicts where each face is); the detector runs in the background on
the frames that call for it (every K-th, or while a face is missed, moving fast or changing look: see
`FaceTracker.due_at` and `looks_changed`), at most one at a time per stream, and its faces are fused into
the tracker on the first frame after they arrive. No frame waits for the detector: the frame that started a
detection is swapped at the predicted positions, like the frames after it.

A detection fused m frames after its own frame places a moving face where it was m frames ago; at 30 fps
with a detector of ~40 ms that is one frame, and the next detection (sooner while the face moves fast)
corrects it.
"""

import logging
import time
from concurrent.futures import Executor, Future

from app.pipeline.stage import DEFAULT_SESSION, Stage
from app.pipeline.timing import StageTimer
from app.pipeline.track import FaceTracker
from app.pipeline.types import Face, Image

log = logging.getLogger(__name__)

BACKGROUND_DETECT = "detect_background"  # its time, reported when it arrives; not part of any frame's path


class LiveTracking:
    """One stream's tracker and its background detection."""

    def __init__(self, tracker: FaceTracker, detect: Stage[Image, list[Face]], executor: Executor) -> None:
        self.tracker = tracker
        self._detect = detect
        self._executor = executor
        self._pending: Future[tuple[list[Face], float]] | None = None
        self._failures = 0

    def locate(self, frame: Image, timer: StageTimer, session: str = DEFAULT_SESSION) -> list[Face]:
        """The faces of `frame`, without waiting for a detection."""
        due = self.tracker.due_at(0) or self.tracker.looks_changed(frame)
        detections = self._arrived(timer)
        with timer.stage("track"):
            faces = self.tracker.update(detections)
            self.tracker.note_looks(frame)
        if due and self._pending is None:
            self._pending = self._executor.submit(self._run, frame, session)
        return faces

    @property
    def in_flight(self) -> "Future[tuple[list[Face], float]] | None":
        """The detection running for this stream, if any."""
        return self._pending

    def _run(self, frame: Image, session: str) -> tuple[list[Face], float]:
        started = time.perf_counter()
        (faces,) = self._detect.process([frame], session=session)
        return faces, time.perf_counter() - started

    def _arrived(self, timer: StageTimer) -> list[Face] | None:
        if self._pending is None or not self._pending.done():
            return None
        future, self._pending = self._pending, None
        try:
            faces, seconds = future.result()
        except Exception:  # a stale or failed detection is skipped; the next due frame starts another
            self._failures += 1
            if self._failures == 1 or self._failures % 100 == 0:
                log.warning("background detection failed (%d so far)", self._failures, exc_info=True)
            return None
        timer.add(BACKGROUND_DETECT, seconds)
        return faces

    def close(self) -> None:
        """Forget a detection still running (its result is not needed)."""
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None
