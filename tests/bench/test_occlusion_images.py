"""The docs' occlusion images take a hand from any RGBA image: its alpha is the hand's true region."""

from pathlib import Path

import cv2
import numpy as np
import pytest

from app.bench.occlusion_images import cutout_from_rgba


def test_an_rgba_image_becomes_a_cutout_whose_mask_is_its_alpha(tmp_path: Path) -> None:
    rgba = np.zeros((40, 30, 4), np.uint8)
    rgba[..., :3] = (30, 90, 200)
    rgba[10:30, 5:20, 3] = 255
    rgba[0, 0, 3] = 127  # under half opaque: not hand
    cv2.imwrite(str(tmp_path / "hand.png"), rgba)
    cutout = cutout_from_rgba(tmp_path / "hand.png")
    assert cutout.pixels.shape == (40, 30, 3) and tuple(cutout.pixels[0, 0]) == (30, 90, 200)
    assert cutout.mask.sum() == 20 * 15 and cutout.mask[10:30, 5:20].all()


def test_an_image_without_alpha_is_refused(tmp_path: Path) -> None:
    cv2.imwrite(str(tmp_path / "flat.png"), np.zeros((8, 8, 3), np.uint8))
    with pytest.raises(ValueError, match="flat.png is not an image with an alpha channel"):
        cutout_from_rgba(tmp_path / "flat.png")
