"""Colour statistics held per face: still under noise, a real change of light followed at once."""

import numpy as np

from app.pipeline.color_hold import DEFAULT_BAND, ColorHold, ColorHolds, Stats

FACE = (np.array([60.0, 12.0, 18.0], np.float32), np.array([14.0, 4.0, 5.0], np.float32))
TARGET = (np.array([55.0, 10.0, 15.0], np.float32), np.array([12.0, 3.0, 4.0], np.float32))


def _noisy(stats: Stats, rng: np.random.Generator, sigma: float) -> Stats:
    mean, spread = (part + rng.normal(0.0, sigma, 3).astype(np.float32) for part in stats)
    return mean, spread


def test_noise_inside_the_band_changes_nothing_applied() -> None:
    rng = np.random.default_rng(0)
    hold = ColorHold()
    first = hold.steady(FACE, TARGET)
    for _ in range(100):
        face, target = hold.steady(_noisy(FACE, rng, 0.1), _noisy(TARGET, rng, 0.1))
        for got, want in zip((*face, *target), (*first[0], *first[1]), strict=True):
            assert np.array_equal(got, want)


def test_a_change_of_light_is_followed_in_the_same_frame_less_the_band() -> None:
    hold = ColorHold()
    hold.steady(FACE, TARGET)
    brighter = (TARGET[0] + np.array([10.0, 0.0, -3.0], np.float32), TARGET[1])
    _, (mean, spread) = hold.steady(FACE, brighter)
    assert np.allclose(mean, TARGET[0] + np.array([10.0 - DEFAULT_BAND, 0.0, -3.0 + DEFAULT_BAND]), atol=1e-5)
    assert np.allclose(spread, TARGET[1])
    # Held there, the same light again moves nothing; a step back in light is followed back.
    assert np.allclose(hold.steady(FACE, brighter)[1][0], mean)
    assert np.allclose(hold.steady(FACE, TARGET)[1][0], TARGET[0] + np.array([DEFAULT_BAND, 0.0, -DEFAULT_BAND]))


def test_without_a_hold_of_its_own_a_face_starts_from_what_is_measured() -> None:
    holds = ColorHolds()
    assert holds.get(1) is holds.get(1) and holds.get(1) is not holds.get(2)
    face, target = holds.get(3).steady(FACE, TARGET)
    assert np.allclose(face[0], FACE[0]) and np.allclose(target[1], TARGET[1])
    holds.forget_except({2})
    assert set(holds.holds) == {2}
