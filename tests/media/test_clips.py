"""Motion clips: a camera's random-walk drift, and a clip as it comes back from an H.264 file."""

import cv2
import numpy as np

from app.media.clips import make_motion_clip, through_h264


def _still() -> np.ndarray:
    """192×256 of smooth random colour, like skin and background rather than like chroma edges (which yuv420p
    halves)."""
    rng = np.random.default_rng(0)
    small = rng.integers(40, 216, size=(6, 8, 3), dtype=np.uint8)
    return np.asarray(cv2.resize(small, (256, 192), interpolation=cv2.INTER_CUBIC), np.uint8)


def test_drift_is_a_random_walk_of_the_camera_with_the_step_asked_for() -> None:
    clip = make_motion_clip(_still(), size=(96, 64), frames=400, pan_px=0, zoom=0, rotate_deg=0, drift_px=0.05)
    shifts = np.array([m[:, 2] for m in clip.matrices])
    steps = np.diff(shifts, axis=0)
    assert 0.04 < float(steps.std()) < 0.06  # each frame's step
    assert float(np.abs(shifts - shifts[0]).max()) > 0.5  # the steps add up: the camera wanders
    still = make_motion_clip(_still(), size=(96, 64), frames=3, pan_px=0, zoom=0, rotate_deg=0)
    assert all(np.allclose(m, still.matrices[0]) for m in still.matrices)


def test_through_h264_keeps_the_motion_and_changes_the_pixels_a_little() -> None:
    clip = make_motion_clip(_still(), size=(96, 64), frames=6, pan_px=2.0, zoom=0, rotate_deg=0, noise_sigma=2.0)
    coded = through_h264(clip, crf=12)
    assert len(coded) == len(clip) and coded.fps == clip.fps and coded.size == clip.size
    assert all(np.array_equal(a, b) for a, b in zip(coded.matrices, clip.matrices, strict=True))
    for made, back in zip(clip.frames, coded.frames, strict=True):
        error = np.abs(made.astype(np.int16) - back).mean()
        assert 0.0 < error < 8.0  # measured 3.7-3.8
