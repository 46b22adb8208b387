"""What an engine makes of an identity enrolled from several photos.

inswapper takes the identity as an ArcFace embedding: the normalised mean of every photo's embedding, so no
single photo's angle or light decides it. The texture engines (mesh, classic) paste one photo's face: the one
that is most frontal and best exposed, scored from the detector's 5 points and the face's own pixels, so a
turned head (stretched texture on the far side) or a dark or blown-out photo loses to a frontal, well-lit one.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import cv2
import numpy as np

from app.pipeline.identity_map import mean_embedding
from app.pipeline.swap import InswapperEngine, PreparedSource, SwapEngine
from app.pipeline.types import Face, Image

# Where the detector's nose point sits between the eye line (0) and the mouth line (1) on a frontal face:
# measured 0.74 on the astronaut and 0.76 on Tom Hanks (RetinaFace's nose point lies lower than the alignment
# templates' 0.5).
FRONTAL_NOSE_HEIGHT = 0.75
# Grey levels: a face whose mean is this far from black and from white counts as well exposed.
WELL_EXPOSED_MARGIN = 96
CLIPPED_DARK, CLIPPED_BRIGHT = 16, 239


@dataclass(frozen=True)
class SourcePhoto:
    image: Image
    face: Face


@dataclass(frozen=True)
class PhotoScore:
    frontality: float  # 1 facing the camera; 0 at a half profile or a steep tilt up or down
    exposure: float  # 1 well exposed; lower for dark, bright or clipped faces

    @property
    def total(self) -> float:
        return self.frontality * self.exposure


def frontality(face: Face) -> float:
    """How squarely the face looks at the camera, from its 5 points (eyes, nose, mouth corners) in the face's own
    frame (so a tilted head in the image plane, which alignment undoes, costs nothing): the nose's sideways
    offset from the midline (yaw) and its height between the eye and mouth lines (pitch)."""
    points = np.asarray(face.landmarks, np.float64)
    eyes = (points[0] + points[1]) / 2
    mouth = (points[3] + points[4]) / 2
    across = points[1] - points[0]
    eye_distance = float(np.linalg.norm(across))
    if eye_distance < 1e-6:
        return 0.0
    u = across / eye_distance
    v = np.array([-u[1], u[0]])
    midline = (eyes + mouth) / 2
    yaw = float(np.dot(points[2] - midline, u)) / eye_distance
    height = float(np.dot(mouth - eyes, v))
    pitch = float(np.dot(points[2] - eyes, v)) / height - FRONTAL_NOSE_HEIGHT if abs(height) > 1e-6 else 1.0
    return max(0.0, 1.0 - 2.0 * abs(yaw)) * max(0.0, 1.0 - 2.0 * abs(pitch))


def exposure(image: Image, face: Face) -> float:
    """How well the inner face (the middle of its box) is exposed: its mean grey level well away from black and
    white, and few clipped pixels."""
    x1, y1, x2, y2 = (float(v) for v in face.box)
    dx, dy = (x2 - x1) * 0.2, (y2 - y1) * 0.2
    height, width = image.shape[:2]
    top, bottom = int(np.clip(y1 + dy, 0, height - 1)), int(np.clip(y2 - dy, 1, height))
    left, right = int(np.clip(x1 + dx, 0, width - 1)), int(np.clip(x2 - dx, 1, width))
    if bottom <= top or right <= left:
        return 0.0
    grey = cv2.cvtColor(np.ascontiguousarray(image[top:bottom, left:right]), cv2.COLOR_BGR2GRAY)
    mean = float(grey.mean())
    clipped = float(((grey <= CLIPPED_DARK) | (grey >= CLIPPED_BRIGHT)).mean())
    return min(1.0, min(mean, 255.0 - mean) / WELL_EXPOSED_MARGIN) * (1.0 - clipped)


def score(photo: SourcePhoto) -> PhotoScore:
    return PhotoScore(frontality(photo.face), exposure(photo.image, photo.face))


def best_photo(photos: Sequence[SourcePhoto]) -> int:
    """The index of the most frontal, best-exposed photo (the first of equals)."""
    if not photos:
        raise ValueError("no photos to choose from")
    totals = [score(p).total for p in photos]
    return int(np.argmax(totals))


def _inner(engine: SwapEngine) -> object:
    inner: object = engine
    while (wrapped := getattr(inner, "inner", None)) is not None:  # wrappers (the mouth mask) prepare as inner
        inner = wrapped
    return inner


def prepare_from_photos(engine: SwapEngine, photos: Sequence[SourcePhoto]) -> tuple[PreparedSource, int | None]:
    """The identity prepared for `engine` from its photos, and which photo it used (None: all of them, as the
    mean of their embeddings)."""
    inner = _inner(engine)
    if isinstance(inner, InswapperEngine) and len(photos) > 1:
        embeddings = [inner.recognizer.embed(p.image, p.face) for p in photos]
        return inner.prepare_embedding(mean_embedding(embeddings)), None
    chosen = best_photo(photos)
    return engine.prepare(photos[chosen].image, photos[chosen].face), chosen
