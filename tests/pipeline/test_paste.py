"""Paste-back fidelity: with a swap model that returns its input, the frame comes back unchanged."""

import cv2
import numpy as np
import pytest

from app.bench.scenes import compose_scene
from app.media.clips import make_motion_clip
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.paste import MaskShape, PasteBack, PasteConfig, PasteItem, crop_region, feather_mask, mask_support
from app.pipeline.pipeline import FramePipeline, PipelineConfig
from app.pipeline.swap import PassthroughEngine
from app.pipeline.types import Image
from tests.helpers import psnr


@pytest.fixture(scope="module")
def identity_pipeline(detector: RetinaFaceDetector) -> FramePipeline:
    return FramePipeline(detector, PassthroughEngine(), config=PipelineConfig(paste=PasteConfig(mask="box")))


@pytest.mark.slow
def test_identity_swap_keeps_every_frame(identity_pipeline: FramePipeline, astronaut: Image, t1: Image) -> None:
    clip = make_motion_clip(astronaut, size=(640, 480), frames=12, pan_px=20, zoom=0.1, rotate_deg=4.0, seed=2)
    frames = [*clip.frames, t1]
    source = identity_pipeline.prepare_source(astronaut)
    results = identity_pipeline.process(frames, source)
    for frame, result in zip(frames, results, strict=True):
        assert result.faces, "the face must be found, or nothing was tested"
        assert psnr(frame, result.image) >= 40.0
        # Outside the region each face's crop covers, not one pixel differs.
        outside = np.ones(frame.shape[:2], bool)
        for face in result.faces:
            from app.pipeline.align import estimate_matrix

            region = crop_region(estimate_matrix(face.landmarks, identity_pipeline.engine.align), 128, frame.shape)
            assert region is not None
            x0, y0, x1, y1 = region
            outside[y0:y1, x0:x1] = False
        assert np.array_equal(frame[outside], result.image[outside])
    assert len(results[-1].faces) == 6


def test_paste_touches_only_the_face_region() -> None:
    rng = np.random.default_rng(0)
    frame = rng.integers(0, 255, (720, 1280, 3), dtype=np.uint8)
    swapped = np.full((128, 128, 3), 255, np.uint8)
    # A face of about 256 px around (600, 300): scale 0.5 from frame to crop.
    matrix = np.array([[0.5, 0.0, -236.0], [0.0, 0.5, -86.0]])
    out = PasteBack(PasteConfig(color_strength=0.0)).paste(frame, [PasteItem(swapped, matrix, swapped)])
    changed = np.argwhere(np.any(out != frame, axis=2))
    (y0, x0), (y1, x1) = changed.min(axis=0), changed.max(axis=0)
    assert x0 >= 472 and x1 <= 728 and y0 >= 172 and y1 <= 428
    # The centre is fully the swapped face; the feathered border blends.
    assert np.all(out[300, 600] == 255)


def test_colour_correction_moves_toward_the_target() -> None:
    target = np.full((128, 128, 3), (60, 90, 160), np.uint8)
    swapped = np.full((128, 128, 3), (160, 150, 140), np.uint8)
    corrected = PasteBack(PasteConfig(color_strength=1.0)).corrected(PasteItem(swapped, np.eye(2, 3), target))
    assert corrected.dtype == np.uint8
    assert np.abs(corrected[64, 64].astype(np.int16) - target[64, 64]).max() < 3
    untouched = PasteBack(PasteConfig(color_strength=0.0)).corrected(PasteItem(swapped, np.eye(2, 3), target))
    assert np.array_equal(untouched, swapped)


@pytest.mark.parametrize("shape", ["box", "ellipse"])
def test_paste_warps_only_the_masks_support_and_matches_a_whole_crop_paste(shape: MaskShape) -> None:
    """Only the image of the mask's non-zero box is warped and blended (for the ellipse, about 0.7 of the
    crop): the frame comes out as if the whole crop's region had been."""
    rng = np.random.default_rng(1)
    frame = np.asarray(cv2.GaussianBlur(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8), (0, 0), 2), np.uint8)
    swapped = np.asarray(cv2.GaussianBlur(rng.integers(0, 255, (256, 256, 3), dtype=np.uint8), (0, 0), 2), np.uint8)
    # A tilted face of about 300 px around (330, 240).
    angle, scale = np.deg2rad(12.0), 256 / 300
    rotation = scale * np.array([[np.cos(angle), np.sin(angle)], [-np.sin(angle), np.cos(angle)]])
    matrix = np.hstack([rotation, (np.array([128.0, 128.0]) - rotation @ (330.0, 240.0))[:, None]])
    config = PasteConfig(mask=shape, color_strength=0.0)
    out = PasteBack(config).paste(frame, [PasteItem(swapped, matrix, swapped)])

    support = mask_support(256, shape, config.margin, config.feather)
    mask = feather_mask(256, shape, config.margin, config.feather)
    x0, y0, x1, y1 = support
    assert mask[y0:y1, x0:x1].sum() == pytest.approx(mask.sum())  # the box holds the whole mask
    assert mask[y0, x0:x1].max() > 0 and mask[y1 - 1, x0:x1].max() > 0  # and is tight
    if shape == "ellipse":
        assert (x1 - x0) * (y1 - y0) < 0.75 * 256 * 256

    whole = crop_region(matrix, 256, frame.shape)
    assert whole is not None
    wx0, wy0, wx1, wy1 = whole
    inverse = cv2.invertAffineTransform(matrix)
    inverse[:, 2] -= (wx0, wy0)
    size = (wx1 - wx0, wy1 - wy0)
    face = cv2.warpAffine(swapped, inverse, size, flags=cv2.INTER_LINEAR)
    alpha = np.asarray(cv2.warpAffine(mask, inverse, size, flags=cv2.INTER_LINEAR), np.float32)
    expected = frame.copy()
    expected[wy0:wy1, wx0:wx1] = cv2.blendLinear(face, frame[wy0:wy1, wx0:wx1], alpha, 1.0 - alpha)
    assert np.abs(out.astype(np.int16) - expected).max() <= 1
    assert np.any(out != frame)


def test_masks_are_feathered_and_zero_at_the_border() -> None:
    for shape in ("box", "ellipse"):
        mask = feather_mask(128, shape, 0.04, 0.05)
        assert mask[64, 64] == pytest.approx(1.0, abs=1e-3)
        assert mask[0].max() == 0 and mask[:, 0].max() == 0 and mask[-1].max() == 0
        assert 0 < mask[64, 20] < 1  # smooth ramp, not a hard edge


def test_scene_builder_places_faces(detector: RetinaFaceDetector, astronaut: Image, t1: Image) -> None:
    scene = compose_scene([astronaut[0:300, 100:350]] * 3, t1[640:], (1280, 720))
    assert scene.shape == (720, 1280, 3)
    (faces,) = detector.process([scene])
    assert len(faces) == 3
