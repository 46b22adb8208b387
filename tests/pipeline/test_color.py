"""Colour transfer in 8-bit LAB through a lookup table against the float LAB reference, on real faces."""

import cv2
import numpy as np
import pytest

from app.pipeline.align import AlignSpec, estimate_matrix, warp_crop
from app.pipeline.color import MIN_SPREAD, lab_stats, thumbnail_stats, transfer_color, transfer_color_u8
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.types import Image
from tests.helpers import psnr


def face_crops(detector: RetinaFaceDetector, photo: Image, size: int = 256) -> list[Image]:
    (faces,) = detector.process([photo])
    spec = AlignSpec("arcface_128", size)
    return [warp_crop(photo, estimate_matrix(face.landmarks, spec), size) for face in faces]


@pytest.mark.parametrize("strength", [1.0, 0.5])
def test_the_lookup_table_transfer_stays_within_about_a_grey_level_of_float_lab_on_faces(
    detector: RetinaFaceDetector, astronaut: Image, t1: Image, strength: float
) -> None:
    crops = face_crops(detector, t1) + face_crops(detector, astronaut)
    assert len(crops) == 7
    pairs = 0
    for source in crops:
        for target in crops:
            if source is target:
                continue
            source_stats, target_stats = thumbnail_stats(source), thumbnail_stats(target)
            if min(source_stats[1]) < MIN_SPREAD:
                continue
            pairs += 1
            exact = np.clip(np.rint(transfer_color(source, source_stats, target_stats, strength)), 0, 255)
            fast = transfer_color_u8(source, source_stats, target_stats, strength)
            assert fast.dtype == np.uint8 and fast.shape == source.shape
            difference = np.abs(fast.astype(np.int16) - exact.astype(np.int16))
            # The 8-bit codes' rounding is multiplied by the gain: about one grey level on average at a chroma
            # gain of 3 (the largest among these faces), a fraction of one at gains near 1.
            assert difference.mean() < 1.25 and np.percentile(difference, 99.9) <= 10
            assert psnr(exact.astype(np.uint8), fast) >= 44.0
    assert pairs == 42


def test_a_grey_photo_is_tinted_not_stretched_into_false_colours(detector: RetinaFaceDetector, t1: Image) -> None:
    """A grey photo's chroma is rounding noise (spread far below one LAB unit): stretching it to a colour
    target's spread paints luminance-dependent tints; below MIN_SPREAD only the mean moves."""
    from app.media.clips import load_sample

    (grey,) = face_crops(detector, load_sample("tom_hanks"))
    target = face_crops(detector, t1)[0]
    grey_stats, target_stats = thumbnail_stats(grey), thumbnail_stats(target)
    assert grey_stats[1][1] < MIN_SPREAD and grey_stats[1][2] < MIN_SPREAD and target_stats[1][1] > 5
    moved = transfer_color_u8(grey, grey_stats, target_stats)
    mean, spread = lab_stats(moved)
    assert spread[1] < 3 and spread[2] < 3  # a tinted grey (stretched, the spreads were the target's 11 and 13)
    assert np.abs(mean[1:] - target_stats[0][1:]).max() < 1.5  # at the target's tint
    assert abs(spread[0] - target_stats[1][0]) < 1.5  # luminance is matched as before


def test_weighted_statistics_match_the_plain_definition(astronaut: Image) -> None:
    image = cv2.resize(astronaut[0:300, 100:400], (64, 64), interpolation=cv2.INTER_AREA)
    weight = np.random.default_rng(0).random((64, 64), dtype=np.float32)
    lab = cv2.cvtColor(image.astype(np.float32) / 255.0, cv2.COLOR_BGR2LAB).reshape(-1, 3).astype(np.float64)
    w = weight.reshape(-1, 1).astype(np.float64)
    mean = (lab * w).sum(axis=0) / w.sum()
    std = np.sqrt(((lab - mean) ** 2 * w).sum(axis=0) / w.sum())
    got_mean, got_std = lab_stats(image, weight)
    np.testing.assert_allclose(got_mean, mean, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(got_std, std, rtol=1e-4, atol=1e-4)


def test_equal_statistics_leave_the_image_untouched(t1: Image) -> None:
    """A passthrough crop pasted onto itself must come back exactly: 8-bit LAB's round trip alone moves pixels
    by up to a few grey levels."""
    crop = np.ascontiguousarray(t1[40:296, 160:416])
    stats = thumbnail_stats(crop)
    assert transfer_color_u8(crop, stats, stats) is crop
    assert not np.array_equal(cv2.cvtColor(cv2.cvtColor(crop, cv2.COLOR_BGR2LAB), cv2.COLOR_LAB2BGR), crop)
