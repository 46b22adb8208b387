"""Measuring faces with dlib, independently of the models the engines use: 68 landmarks and a 128-d identity
embedding (`face_recognition_models`, CC0; dlib's same-person threshold is 0.6 in euclidean distance).

Used only for measuring swap quality in benchmarks and tests: the 68-point predictor's training data (iBUG
300-W) excludes commercial use, so it never runs in the product.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from app.identity.dlib_models import SHAPE_68, load_dlib_models
from app.pipeline.types import Image

SAME_PERSON = 0.6  # dlib's published threshold for its 128-d embedder
OUTER_EYE_CORNERS = (36, 45)


@dataclass(frozen=True)
class FaceMeasure:
    """What dlib sees of one face: 68 landmarks (pixels) and the 128-d embedding."""

    landmarks: npt.NDArray[np.float64]
    embedding: npt.NDArray[np.float64]

    @property
    def eye_distance(self) -> float:
        a, b = OUTER_EYE_CORNERS
        return float(np.linalg.norm(self.landmarks[a] - self.landmarks[b]))

    def eye_opening(self) -> float:
        """Mean eye aspect ratio of both eyes (lid gap over eye width)."""
        points = self.landmarks

        def ratio(eye: range) -> float:
            p = points[list(eye)]
            gap = np.linalg.norm(p[1] - p[5]) + np.linalg.norm(p[2] - p[4])
            return float(gap / (2.0 * max(float(np.linalg.norm(p[0] - p[3])), 1e-6)))

        return (ratio(range(36, 42)) + ratio(range(42, 48))) / 2.0

    def mouth_opening(self) -> float:
        """Inner lip gap over the inner mouth width."""
        p = self.landmarks
        return float(np.linalg.norm(p[62] - p[66]) / max(float(np.linalg.norm(p[60] - p[64])), 1e-6))


class DlibMeasurer:
    """dlib's 68-point predictor and ResNet embedder on a face given by its box."""

    def __init__(self) -> None:
        models = load_dlib_models(SHAPE_68, "measuring swap quality", "quality")
        self._dlib: Any = models.dlib
        self._shape = models.shape
        self._embedder = models.net
        self._detector = models.dlib.get_frontal_face_detector()

    def box(self, image: Image) -> tuple[int, int, int, int] | None:
        """The largest face dlib's HOG detector finds (x0, y0, x1, y1), or None."""
        found = self._detector(np.ascontiguousarray(image[..., ::-1]), 1)
        if not found:
            return None
        best = max(found, key=lambda r: r.width() * r.height())
        return int(best.left()), int(best.top()), int(best.right()), int(best.bottom())

    def measure(self, image: Image, box: tuple[int, int, int, int]) -> FaceMeasure:
        rgb = np.ascontiguousarray(image[..., ::-1])
        rect = self._dlib.rectangle(*box)
        shape = self._shape(rgb, rect)
        points = np.array([[shape.part(i).x, shape.part(i).y] for i in range(68)], np.float64)
        embedding = np.array(self._embedder.compute_face_descriptor(rgb, shape), np.float64)
        return FaceMeasure(points, embedding)
