"""Identity enrolment: from an uploaded photo to a prepared identity and its thumbnail, and the same face choice
again when a stored identity is prepared for another model (`app.pipeline.face_choice`)."""

from dataclasses import dataclass

import cv2
import numpy as np

from app.errors import UserError
from app.identity.images import ImageInfo, ImageRejected, decode_image, encode_stored
from app.identity.photo_check import source_warnings
from app.identity.store import Prepare
from app.pipeline.face_choice import FaceChoiceError, choose_face, enrolled_choice
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.pipeline.types import Face, Image

THUMB_SIZE = 160


@dataclass(frozen=True)
class Enrolment:
    info: ImageInfo
    faces: int
    prepared: PreparedSource
    thumbnail: bytes
    stored: bytes  # the decoded photo as PNG: what the store keeps, never the uploaded bytes
    warnings: list[str]  # why this photo may swap badly (app.identity.photo_check); it is still enrolled


def thumbnail(image: Image, face: Face) -> bytes:
    """A JPEG of the face with some margin, at most THUMB_SIZE pixels on its long side."""
    x1, y1, x2, y2 = (float(v) for v in face.box)
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    half = max(x2 - x1, y2 - y1) * 0.7
    height, width = image.shape[:2]
    top, bottom = int(max(0, cy - half)), int(min(height, cy + half))
    left, right = int(max(0, cx - half)), int(min(width, cx + half))
    crop = image[top:bottom, left:right] if bottom > top and right > left else image
    scale = THUMB_SIZE / max(crop.shape[:2])
    if scale < 1:
        size = (max(1, round(crop.shape[1] * scale)), max(1, round(crop.shape[0] * scale)))
        crop = np.asarray(cv2.resize(crop, size, interpolation=cv2.INTER_AREA), np.uint8)
    ok, encoded = cv2.imencode(".jpg", np.ascontiguousarray(crop), [cv2.IMWRITE_JPEG_QUALITY, 85])
    if not ok:
        raise RuntimeError("thumbnail encoding failed")
    return encoded.tobytes()


def enrol(pipeline: FramePipeline, data: bytes, max_pixels: int, face_index: int | None) -> Enrolment:
    """Blocking (run it in an executor): decode, find faces, pick one, prepare it for the engine. A photo that
    cannot be enrolled is an ImageRejected with the HTTP status and reason."""
    image, info = decode_image(data, max_pixels)
    (faces,) = pipeline.detector.process([image])
    try:
        face = choose_face(faces, enrolled_choice(face_index))
    except FaceChoiceError as exc:
        raise ImageRejected(422, str(exc)) from None
    try:
        prepared = pipeline.engine.prepare(image, face)
    except UserError as exc:  # the engine cannot use this face (e.g. no dense landmarks on it)
        raise ImageRejected(422, str(exc)) from None
    return Enrolment(
        info, len(faces), prepared, thumbnail(image, face), encode_stored(image), source_warnings(prepared)
    )


def re_preparer(pipeline: FramePipeline) -> Prepare:
    """How a stored identity is prepared again for the loaded model: the face it was enrolled with."""

    def prepare(image: Image, face_index: int | None) -> PreparedSource:
        return pipeline.prepare_source(image, enrolled_choice(face_index))

    return prepare
