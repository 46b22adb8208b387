"""Tracking between detections: reuse faces across frames, smooth their landmarks, follow entries and exits.

Each face's box and landmarks (14 numbers) are filtered by a constant-velocity Kalman filter, so still
faces stop jittering while moving faces are followed without lag; frames between detections (every K-th
frame is detected) use the filter's prediction. Noise levels are relative to the face's size, so the same
settings work for a face of 40 px and one of 400 px.
"""

from dataclasses import dataclass, field

import numpy as np

from app.pipeline.types import Face


@dataclass(frozen=True)
class TrackerConfig:
    detect_interval: int = 1  # detect every K-th frame; predict in between
    measurement_noise: float = 0.008  # detector jitter, as a fraction of the face size (sigma)
    motion_noise: float = 0.004  # unmodelled acceleration per frame, as a fraction of the face size (sigma)
    max_missed: int = 2  # detection rounds a face may go unseen before its track ends
    iou_threshold: float = 0.3


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    ix = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    iy = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = ix * iy
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return float(inter / union) if union > 0 else 0.0


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
    missed: int = 0

    def __post_init__(self) -> None:
        self.velocity = np.zeros_like(self.position)
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

    def face(self) -> Face:
        return Face(
            box=self.position[:4].astype(np.float32),
            score=self.score,
            landmarks=self.position[4:].reshape(5, 2).astype(np.float32),
            track_id=self.track_id,
        )


class FaceTracker:
    """Per-stream state. Call `due()` to learn whether the next frame needs detection, then `update()`
    with its detections (or None when it was not detected)."""

    def __init__(self, config: TrackerConfig | None = None) -> None:
        self.config = config or TrackerConfig()
        self._tracks: list[_Track] = []
        self._next_id = 0
        self._frame = 0

    def due(self) -> bool:
        return self.due_at(0)

    def due_at(self, offset: int) -> bool:
        """Whether the frame `offset` frames after the next one needs detection."""
        return (self._frame + offset) % max(1, self.config.detect_interval) == 0

    def reset(self) -> None:
        self._tracks.clear()
        self._frame = 0

    def update(self, detections: list[Face] | None) -> list[Face]:
        self._frame += 1
        for track in self._tracks:
            track.predict(self.config)
        if detections is not None:
            self._associate(detections)
        # A face missed in the latest detection round is not swapped, but its track waits a few rounds.
        return [t.face() for t in self._tracks if t.missed == 0]

    def _associate(self, detections: list[Face]) -> None:
        pairs = sorted(
            (
                (_iou(track.position[:4], det.box), ti, di)
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
            self._tracks[ti].correct(_state(detections[di]), detections[di].score, self.config)
            used_tracks.add(ti)
            used_dets.add(di)
        for ti, track in enumerate(self._tracks):
            if ti not in used_tracks:
                track.missed += 1
                track.velocity[:] = 0.0  # unseen faces wait where they were last seen
        self._tracks = [t for t in self._tracks if t.missed <= self.config.max_missed]
        for di, det in enumerate(detections):
            if di not in used_dets:
                self._tracks.append(_Track(self._next_id, _state(det), det.score))
                self._next_id += 1
