"""Tracking between detections: reuse faces across frames, smooth their landmarks, follow entries and exits.

Each face's box and landmarks (14 numbers) are filtered by a constant-velocity Kalman filter, so still
faces stop jittering while moving faces are followed without lag; frames between detections (every K-th
frame is detected) use the filter's prediction. Noise levels are relative to the face's size, so the same
settings work for a face of 40 px and one of 400 px.

A face that was being swapped is never shown unswapped because the detector missed it (`on_face_lost`):
through short misses it is swapped at the predicted position; lost for longer, it is covered where it was
last seen (`hold`: the last swapped face stays frozen there; `cover`: that region is pixelated) until it is
found again or `cover_frames` pass. `pass` drops a missed face at once (it shows unswapped).
"""

from dataclasses import dataclass, field
from typing import Literal

import cv2
import numpy as np

from app.names import FaceLostPolicy
from app.pipeline.color_hold import ColorHolds
from app.pipeline.mesh_track import MeshTracking
from app.pipeline.occlusion import HandTracking
from app.pipeline.paste import PasteItem
from app.pipeline.smoothing import LandmarkSmoother
from app.pipeline.types import Face, FaceStatus, Image

# A face's region is compared between frames as a 32×32 grey thumbnail (tens of µs): its shift is measured by
# phase correlation, and what is left once the shift is undone is compared on the central 24×24, averaged
# down to 12×12 (camera noise and sub-pixel resampling average out).
LOOK_SIZE = 32
LOOK_INSET = 4
LOOK_COMPARE = 12
_LOOK_WINDOW = cv2.createHanningWindow((LOOK_SIZE, LOOK_SIZE), cv2.CV_32F)


@dataclass(frozen=True)
class TrackerConfig:
    detect_interval: int = 1  # detect every K-th frame; predict in between
    measurement_noise: float = 0.008  # detector jitter, as a fraction of the face size (sigma)
    motion_noise: float = 0.004  # unmodelled acceleration per frame, as a fraction of the face size (sigma)
    max_missed: int = 2  # with `pass`: detection rounds a face may go unseen before its track ends
    iou_threshold: float = 0.3
    on_face_lost: FaceLostPolicy = "hold"
    hold_frames: int = 4  # frames a missed face is swapped at its predicted position before it is covered
    cover_frames: int = 150  # frames a lost face stays covered before its track ends (5 s at 30 fps)
    # An unmatched face this close (in face sizes) to an unmatched track is that face, moved fast or found again.
    refind_distance: float = 4.0
    # Mean grey-level change of a face's region between frames, once its shift is undone, that calls for
    # detection (something crossed the face, or it turned).
    look_change: float = 10.0
    # Shift of a face's region between frames, beyond the tracker's own prediction, that calls for detection
    # (in face sizes): the face moved where the prediction would not put it.
    look_shift: float = 0.05
    fast_motion: float = 0.05  # face sizes per frame above which every frame is detected (7 px for a 150 px face)


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


def _look(frame: Image, box: np.ndarray) -> np.ndarray:
    height, width = frame.shape[:2]
    x0, y0 = int(np.clip(box[0], 0, width - 1)), int(np.clip(box[1], 0, height - 1))
    x1, y1 = int(np.clip(np.ceil(box[2]), x0 + 1, width)), int(np.clip(np.ceil(box[3]), y0 + 1, height))
    grey = cv2.cvtColor(frame[y0:y1, x0:x1], cv2.COLOR_BGR2GRAY)
    return cv2.resize(grey, (LOOK_SIZE, LOOK_SIZE), interpolation=cv2.INTER_AREA).astype(np.float32)


def _look_change(before: np.ndarray, after: np.ndarray) -> tuple[float, float, float]:
    """How the face's region moved from `before` to `after` (x, y, as fractions of the region) and their mean
    grey-level difference once that shift is undone."""
    (dx, dy), _ = cv2.phaseCorrelate(before, after, _LOOK_WINDOW)
    if not (np.isfinite(dx) and np.isfinite(dy)):  # a flat region has no shift to find
        dx = dy = 0.0
    undo = np.array([[1.0, 0.0, -dx], [0.0, 1.0, -dy]], np.float32)
    back = cv2.warpAffine(after, undo, (LOOK_SIZE, LOOK_SIZE), borderMode=cv2.BORDER_REPLICATE)
    inner = slice(LOOK_INSET, LOOK_SIZE - LOOK_INSET)
    small = (LOOK_COMPARE, LOOK_COMPARE)
    a = cv2.resize(before[inner, inner], small, interpolation=cv2.INTER_AREA)
    b = cv2.resize(back[inner, inner], small, interpolation=cv2.INTER_AREA)
    return dx / LOOK_SIZE, dy / LOOK_SIZE, float(np.abs(a - b).mean())


def _state(face: Face) -> np.ndarray:
    return np.concatenate([face.box.astype(np.float64), face.landmarks.reshape(-1).astype(np.float64)])


@dataclass
class _Track:
    track_id: int
    position: np.ndarray
    score: float
    velocity: np.ndarray = field(init=False)
    # One 2×2 covariance (position, velocity) serves every coordinate: they share the noise model.
    covariance: np.ndarray = field(init=False)
    missed: int = 0  # detection rounds in a row without this face
    unseen: int = 0  # frames since a detection last matched this face
    last_pasted: PasteItem | None = None  # how it was last swapped, frozen over it while lost (`hold`)
    look: np.ndarray | None = None  # its region in the latest frame, as a thumbnail
    seen_at: np.ndarray = field(init=False)  # where a detection last placed it: where it is covered once lost

    def __post_init__(self) -> None:
        self.velocity = np.zeros_like(self.position)
        self.seen_at = self.position.copy()
        self.covariance = np.diag([1.0, 1.0]) * self.size**2

    @property
    def size(self) -> float:
        box = self.position[:4]
        return float(np.sqrt(max(1.0, (box[2] - box[0]) * (box[3] - box[1]))))

    def predict(self, config: TrackerConfig) -> None:
        self.position = self.position + self.velocity
        q = (config.motion_noise * self.size) ** 2
        f = np.array([[1.0, 1.0], [0.0, 1.0]])
        self.covariance = f @ self.covariance @ f.T + q * np.array([[0.25, 0.5], [0.5, 1.0]])

    def correct(self, measured: np.ndarray, score: float, config: TrackerConfig) -> None:
        r = (config.measurement_noise * self.size) ** 2
        p = self.covariance
        gain = p[:, 0] / (p[0, 0] + r)
        residual = measured - self.position
        self.position = self.position + gain[0] * residual
        self.velocity = self.velocity + gain[1] * residual
        self.covariance = p - np.outer(gain, p[0, :])
        self.score = score
        self.missed = 0
        self.unseen = 0
        self.seen_at = self.position.copy()

    def speed(self) -> float:
        """How far the face's centre moves per frame, in face sizes."""
        v = self.velocity[:4]
        return float(np.hypot((v[0] + v[2]) / 2, (v[1] + v[3]) / 2)) / self.size

    def status(self, config: TrackerConfig) -> FaceStatus:
        if self.missed == 0:
            return "seen"
        return "predicted" if self.unseen <= config.hold_frames else "lost"

    def face(self, config: TrackerConfig) -> Face:
        return Face(
            box=self.position[:4].astype(np.float32),
            score=self.score,
            landmarks=self.position[4:].reshape(5, 2).astype(np.float32),
            track_id=self.track_id,
            status=self.status(config),
        )


class FaceTracker:
    """Per-stream state. Call `due()` to learn whether the next frame needs detection, then `update()`
    with its detections (or None when it was not detected)."""

    def __init__(self, config: TrackerConfig | None = None) -> None:
        self.config = config or TrackerConfig()
        self._tracks: list[_Track] = []
        self._next_id = 0
        self._frame = 0
        self._asked = False  # a detection was asked for (`request_detection`) and has not come yet
        # The engine's landmark chains for this stream's faces, when its engine tracks landmarks (the pipeline
        # makes them on first use): all of one stream's state lives with its tracker.
        self.landmarks: MeshTracking | None = None
        self.hands: HandTracking | None = None  # hands found over its faces, when occlusion is on
        self.occlusion = True  # this stream keeps hands in front (where the pipeline has the stage); users switch it
        self.keep_mouth: bool | None = None  # this stream keeps the target's mouth (None: the server's setting)
        self.smoother: LandmarkSmoother | None = None  # its faces' landmark filters, when they are smoothed
        self.colors = ColorHolds()  # its faces' colour statistics as the swap engine applied them

    # When to detect: decided here only; the pipeline (files, batches) and live streams ask.
    def needs_detection(self, frame: Image, offset: int = 0) -> bool:
        """Whether the frame `offset` frames ahead must be detected when frames are processed in order: due by
        the schedule or a doubt, or (the next frame) a face's region changed since the previous frame."""
        return self.due_at(offset) or (offset == 0 and self.looks_changed(frame))

    def wait_reason(self, frame: Image, scheduled: bool) -> str | None:
        """Why a live frame must wait for a detection (`new`, `missed`, `fast`, `looks`), or None when the
        tracker vouches for it and a due detection may run in the background: no face is tracked yet when one
        is `scheduled`, a face is missed or moves fast, or a face's region changed since the previous frame."""
        if scheduled and not self.tracking:
            return "new"
        doubt = self.doubt()
        if doubt is not None:
            return doubt
        return "looks" if self.looks_changed(frame) else None

    def due(self) -> bool:
        return self.due_at(0)

    def due_at(self, offset: int) -> bool:
        """Whether the frame `offset` frames after the next one needs detection: every K-th frame, and
        every frame while a face is missed or moves fast (prediction alone would fall behind it), and the
        next frame once a detection was asked for."""
        if (self._frame + offset) % max(1, self.config.detect_interval) == 0 or (self._asked and offset == 0):
            return True
        return self.unsure()

    def unsure(self) -> bool:
        """Whether a prediction alone may misplace a face: one is being searched for (missed) or moves fast.
        Live streams detect such frames before using them (app.pipeline.live)."""
        return self.doubt() is not None

    def doubt(self) -> Literal["missed", "fast"] | None:
        """Why a prediction alone may misplace a face (`unsure`): a face is missed, or one moves fast."""
        if any(t.missed > 0 for t in self._tracks):
            return "missed"
        if any(t.speed() > self.config.fast_motion for t in self._tracks):
            return "fast"
        return None

    @property
    def tracking(self) -> bool:
        """Whether any face is being followed (seen, predicted or covered)."""
        return bool(self._tracks)

    def reset(self) -> None:
        self._tracks.clear()
        self._frame = 0

    def request_detection(self) -> None:
        """Detect the next frame whatever the schedule (dense landmarks lost a face the tracker still has)."""
        self._asked = True

    def update(self, detections: list[Face] | None, age: int = 0) -> list[Face]:
        """The faces of the next frame: seen (or predicted between detection rounds), predicted through a
        short miss, or lost (to be covered); with `pass`, only faces seen in the latest round. `age`: how
        many frames before this one the detections were made (background detection): each is matched to
        where its track was then and carried forward by the track's velocity."""
        self._frame += 1
        for track in self._tracks:
            if track.status(self.config) == "lost":
                # A lost face is covered where it was last seen: a prediction may have carried it out of view.
                track.position, track.velocity[:] = track.seen_at.copy(), 0.0
            track.predict(self.config)
            track.unseen += 1
        if detections is not None:
            self._asked = False
            self._associate(detections, age)
        if self.config.on_face_lost == "pass":
            return [t.face(self.config) for t in self._tracks if t.missed == 0]
        return [t.face(self.config) for t in self._tracks]

    def looks_changed(self, frame: Image) -> bool:
        """Whether a face's region changed since the previous frame in a way the prediction cannot know, so
        this frame is detected: the face moved by more than `look_shift` face sizes beyond the track's
        predicted motion (it jumped, or the camera jerked), or, with its motion undone, the region changed by
        more than `look_change` grey levels (something crossed the face, or it turned). A face that moves
        smoothly changes its region a lot between frames far apart (a loaded server skips frames); measured
        against its own shift, it does not."""
        return any(t.look is not None and self._changed(t, frame) for t in self._tracks)

    def _changed(self, track: _Track, frame: Image) -> bool:
        assert track.look is not None
        box = track.position[:4]
        fx, fy, residual = _look_change(track.look, _look(frame, box))
        if residual > self.config.look_change:
            return True
        v = track.velocity[:4]
        moved_x = fx * (box[2] - box[0]) - (v[0] + v[2]) / 2
        moved_y = fy * (box[3] - box[1]) - (v[1] + v[3]) / 2
        return float(np.hypot(moved_x, moved_y)) / track.size > self.config.look_shift

    def note_looks(self, frame: Image) -> None:
        """Keep each face's region in `frame` (the frame just tracked) for `looks_changed` on the next one."""
        for track in self._tracks:
            track.look = _look(frame, track.position[:4])

    def remember(self, track_id: int, item: PasteItem) -> None:
        """How face `track_id` was swapped in this frame: what `hold` freezes over it once it is lost (kept
        only where a detection placed it, as is the cover)."""
        for track in self._tracks:
            if track.track_id == track_id and track.missed == 0:
                track.last_pasted = item

    def last_pasted(self, track_id: int) -> PasteItem | None:
        return next((t.last_pasted for t in self._tracks if t.track_id == track_id), None)

    def _alive(self, track: _Track) -> bool:
        if self.config.on_face_lost == "pass":
            return track.missed <= self.config.max_missed
        return track.unseen <= self.config.hold_frames + self.config.cover_frames

    def _associate(self, detections: list[Face], age: int = 0) -> None:
        pairs = sorted(
            (
                (_iou(track.position[:4] - track.velocity[:4] * age, det.box), ti, di)
                for ti, track in enumerate(self._tracks)
                for di, det in enumerate(detections)
            ),
            reverse=True,
        )
        used_tracks: set[int] = set()
        used_dets: set[int] = set()
        for iou, ti, di in pairs:
            if iou < self.config.iou_threshold:
                break
            if ti in used_tracks or di in used_dets:
                continue
            track = self._tracks[ti]
            track.correct(_state(detections[di]) + track.velocity * age, detections[di].score, self.config)
            used_tracks.add(ti)
            used_dets.add(di)
        if self.config.on_face_lost != "pass":
            self._rematch(detections, used_tracks, used_dets)
        for ti, track in enumerate(self._tracks):
            if ti not in used_tracks:
                track.missed += 1
                if self.config.on_face_lost == "pass":
                    track.velocity[:] = 0.0  # unseen faces wait where they were last seen
        self._tracks = [t for t in self._tracks if self._alive(t)]
        for di, det in enumerate(detections):
            if di not in used_dets:
                self._tracks.append(_Track(self._next_id, _state(det), det.score))
                self._next_id += 1

    def _rematch(self, detections: list[Face], used_tracks: set[int], used_dets: set[int]) -> None:
        """Unmatched faces near unmatched tracks (nearest first, within `refind_distance` face sizes) are
        those faces, moved too fast to overlap or found again: the track restarts there, keeping its id, so
        its cover ends and no second track is born beside it."""

        def centre(box: np.ndarray) -> np.ndarray:
            return (box[:2] + box[2:]) / 2

        pairs = sorted(
            (float(np.linalg.norm(centre(track.position[:4]) - centre(det.box))) / track.size, ti, di)
            for ti, track in enumerate(self._tracks)
            if ti not in used_tracks
            for di, det in enumerate(detections)
            if di not in used_dets
        )
        for distance, ti, di in pairs:
            if distance > self.config.refind_distance:
                break
            if ti in used_tracks or di in used_dets:
                continue
            det = detections[di]
            self._tracks[ti] = _Track(self._tracks[ti].track_id, _state(det), det.score)
            used_tracks.add(ti)
            used_dets.add(di)
