"""One-Euro smoothing of landmarks: jitter on a still face goes, a moving face is followed without lag."""

import numpy as np

from app.pipeline.smoothing import LandmarkSmoother, SmoothingConfig


def _run(smoother: LandmarkSmoother, path: np.ndarray, noise: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = rng.uniform(0, 100, size=(468, 2))
    out = []
    for shift in path:
        measured = (base + shift + rng.normal(0, noise, base.shape)).astype(np.float32)
        out.append(smoother.smooth(1, measured, scale=50.0) - base)
    return np.asarray(out)


def test_a_still_face_loses_most_of_its_jitter() -> None:
    path = np.zeros((60, 2))
    smoothed = _run(LandmarkSmoother(), path, noise=0.6)
    raw = _run(LandmarkSmoother(SmoothingConfig(min_cutoff=1e6)), path, noise=0.6)  # a cutoff that lets all through
    jitter = float(np.sqrt((np.diff(smoothed[10:], axis=0) ** 2).sum(axis=2).mean()))
    raw_jitter = float(np.sqrt((np.diff(raw[10:], axis=0) ** 2).sum(axis=2).mean()))
    assert jitter < 0.5 * raw_jitter


def test_a_fast_face_is_followed_within_a_frame() -> None:
    speed = 15.0  # px per frame: a 50 px eye distance crossed in about 3 frames
    path = np.stack([np.arange(40) * speed, np.zeros(40)], axis=1)
    smoothed = _run(LandmarkSmoother(), path, noise=0.0)
    behind = path[20:, 0] - smoothed[20:].mean(axis=1)[:, 0]
    assert float(behind.mean()) < speed, "less than one frame behind"


def test_faces_are_forgotten_when_their_track_ends() -> None:
    smoother = LandmarkSmoother()
    smoother.smooth(1, np.zeros((468, 2), np.float32), 50.0)
    smoother.smooth(2, np.zeros((468, 2), np.float32), 50.0)
    smoother.forget_except({2})
    assert set(smoother.states) == {2}
