"""What counts as the same picture for the live gate: a camera's noise and sub-pixel drift do, a movement or a
patch of new content does not."""

import numpy as np

from app.content.unchanged import TOLERANCE, change, look, unchanged
from app.media.clips import make_motion_clip
from app.pipeline.types import Image
from tests.content.marker import marked


def test_a_still_cameras_noise_and_drift_leave_the_picture_unchanged(astronaut: Image) -> None:
    clip = make_motion_clip(
        astronaut, size=(1280, 720), frames=300, pan_px=1.0, zoom=0.0, rotate_deg=0.0, noise_sigma=2.0, seed=1
    ).frames
    first = look(clip[0])
    assert all(unchanged(first, look(frame)) for frame in clip[::30]), [change(first, look(f)) for f in clip[::30]]


def test_movement_and_new_content_change_the_picture(astronaut: Image) -> None:
    moving = make_motion_clip(astronaut, size=(1280, 720), frames=300, noise_sigma=2.0, seed=1).frames
    assert not unchanged(look(moving[0]), look(moving[30]))  # a second of a slow pan and zoom
    frame = moving[0]
    assert not unchanged(look(frame), look(marked(frame, share=0.2)))  # a patch a fifth of each side
    assert change(look(frame), look(frame)) == 0.0
    assert change(look(frame), look(np.ascontiguousarray(frame[:, ::-1]))) > TOLERANCE
