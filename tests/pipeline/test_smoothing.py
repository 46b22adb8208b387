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


def test_the_dead_band_holds_a_still_face_where_the_filter_alone_wanders() -> None:
    path = np.zeros((90, 2))
    banded = _run(LandmarkSmoother(), path, noise=0.3)
    plain = _run(LandmarkSmoother(SmoothingConfig(dead_band=0.0)), path, noise=0.3)

    def moving(points: np.ndarray) -> float:
        return float(np.abs(np.diff(points[10:], axis=0)).sum(axis=2).mean())

    assert moving(banded) < 0.2 * moving(plain)
    # Never further from the face than the band (0.005 of the 50 px eye distance) and the filter's own wander.
    assert float(np.abs(banded[10:]).max()) <= float(np.abs(plain[10:]).max()) + 0.25 + 1e-6


def test_the_dead_band_follows_a_move_within_the_band_and_closes_on_a_moving_face() -> None:
    config = SmoothingConfig()
    band_px = config.dead_band * 50.0
    # A still face that then steps 3 px aside and stays: shown within the band of it a few frames on.
    step = np.concatenate([np.zeros((20, 2)), np.tile([3.0, 0.0], (40, 1))])
    shown = _run(LandmarkSmoother(config), step, noise=0.0).mean(axis=1)
    assert np.all(np.abs(shown[35:, 0] - 3.0) <= band_px + 1e-3)
    # A face moving steadily (an eye distance in two seconds): the band closes, shown where the filter has it.
    smoother = LandmarkSmoother(config)
    base = np.random.default_rng(1).uniform(0, 100, size=(468, 2))
    for t in range(40):
        out = smoother.smooth(1, (base + [t * 50.0 / 60.0, 0.0]).astype(np.float32), scale=50.0)
    state = smoother.states[1]
    assert state.speed > config.band_release
    assert np.allclose(out, state.points, atol=1e-4)
