"""Live video: detection off the frame's critical path.

Every frame is tracked (the tracker predicts where each face is); the detector runs in the background on
the frames that call for it (every K-th, or while a face is missed or moving fast: `FaceTracker.due_at`),
at most one at a time per stream, and its faces are fused into the tracker on the first frame after they
arrive: the frame that started a detection is swapped at the predicted positions, like the frames after
it. A frame waits for the detector only when the tracker cannot vouch for it (no face tracked yet, a face
is being searched for or moves fast: `FaceTracker.unsure`, or a face's region changed at once:
`FaceTracker.looks_changed`), so that a face is never shown unswapped for the frames a background run
would take. Background runs are thus the scheduled refreshes of faces that hold still or drift.

Why fast and missed faces wait: with them in the background too, the face-lost clip paced at 30 fps on a
loaded 2-core machine revealed the face in 11 (`hold`) and 4 (`cover`) of 122 frames, all as it came back
into the frame and stopped: detections 2-4 frames old, carried forward by a velocity of ~50 px a frame,
kept the track moving past the face after it stopped, and its swap landed beside it. Detected inline, 0.

A detection fused m frames after its own frame places a moving face where it was m frames ago; at 30 fps
with a detector of ~40 ms that is one frame, and the next detection (sooner while the face moves fast)
corrects it.
"""

import logging
import time
from collections import Counter
from concurrent.futures import Executor, Future

from app.pipeline.stage import DEFAULT_SESSION, Stage
from app.pipeline.timing import StageTimer
from app.pipeline.track import FaceTracker
from app.pipeline.types import Face, Image

log = logging.getLogger(__name__)

BACKGROUND_DETECT = "detect_background"  # its time, reported when it arrives; not part of any frame's path
# Why a frame waited for a detection (no face tracked yet; a face missed, fast or changed), and background runs.
DETECTION_REASONS = ("new", "missed", "fast", "looks", "background")


class LiveTracking:
    """One stream's tracker and its background detection."""

    def __init__(self, tracker: FaceTracker, detect: Stage[Image, list[Face]], executor: Executor) -> None:
        self.tracker = tracker
        self._detect = detect
        self._executor = executor
        self._pending: Future[tuple[list[Face], float]] | None = None
        self._pending_since = 0  # frames located since the pending detection's frame
        self._failures = 0
        # Why frames waited for a detection (new, missed, fast, looks), and background runs started: where
        # detection time goes, in the session's stats.
        # Every key exists from the start, so a reader on another thread never sees the dict change size.
        self.detections: Counter[str] = Counter(dict.fromkeys(DETECTION_REASONS, 0))

    def locate(self, frame: Image, timer: StageTimer, session: str = DEFAULT_SESSION) -> list[Face]:
        """The faces of `frame`. The frame waits for a detection only when the tracker cannot vouch for it:
        no face is tracked yet (a face that appears is swapped from its first detected frame), a face's
        region changed since the previous frame (it jumped or turned: a stale position would show it),
        or a face is missed or moves fast. Otherwise detections due by schedule run in the background."""
        scheduled = self.tracker.due_at(0)
        reason = self.tracker.wait_reason(frame, scheduled)
        if reason is not None:
            self.detections[reason] += 1
            self._forget_pending()  # older than what is about to be found
            with timer.stage("detect"):
                (found,) = self._detect.process([frame], session=session)
            return self._track(frame, found, timer)
        age = self._pending_since + 1
        faces = self._track(frame, self._arrived(timer), timer, age)
        self._pending_since += 1
        if scheduled and self._pending is None:
            self._pending = self._executor.submit(self._run, frame, session)
            self._pending_since = 0
            self.detections["background"] += 1
        return faces

    def _track(self, frame: Image, detections: list[Face] | None, timer: StageTimer, age: int = 0) -> list[Face]:
        with timer.stage("track"):
            faces = self.tracker.update(detections, age if detections is not None else 0)
            self.tracker.note_looks(frame)
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

    def _forget_pending(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def close(self) -> None:
        """Forget a detection still running (its result is not needed)."""
        self._forget_pending()
