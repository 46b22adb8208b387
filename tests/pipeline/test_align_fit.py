"""Alignment's closed-form similarity fit is scikit-image's Umeyama estimate (the one insightface aligns with)."""

import numpy as np
import pytest
from skimage.transform import SimilarityTransform

from app.pipeline.align import TEMPLATES, AlignSpec, estimate_matrix, similarity_fit, transform_points


def test_the_fit_is_scikit_images_umeyama_estimate_on_noisy_rotated_and_mirrored_points() -> None:
    rng = np.random.default_rng(0)
    template = TEMPLATES["arcface_128"] * 128
    for trial in range(300):
        angle, scale = rng.uniform(-np.pi, np.pi), rng.uniform(0.2, 5.0)
        rotation = scale * np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
        source = template @ rotation.T + rng.uniform(-500, 500, 2) + rng.normal(0, 4, (5, 2))
        if trial % 3 == 0:
            source[:, 0] *= -1  # a mirrored face: the best similarity cannot reflect it back
        expected = SimilarityTransform.from_estimate(source, template).params[:2]
        assert np.allclose(similarity_fit(source, template), expected, atol=1e-9, rtol=1e-9)


def test_estimate_matrix_maps_the_landmarks_onto_the_template() -> None:
    spec = AlignSpec("face_mesh_tight", 288)
    destination = TEMPLATES[spec.template] * spec.size
    landmarks = (destination - 40.0) * 1.7 + np.array([300.0, 200.0])
    matrix = estimate_matrix(landmarks.astype(np.float32), spec)
    assert matrix.shape == (2, 3) and matrix.dtype == np.float64
    assert np.allclose(transform_points(landmarks, matrix), destination, atol=1e-9)


def test_points_that_all_coincide_have_no_fit() -> None:
    with pytest.raises(ValueError, match="coincide"):
        similarity_fit(np.ones((5, 2)), TEMPLATES["arcface_128"])
