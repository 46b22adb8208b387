"""Identity enrolment: from an uploaded photo to a prepared identity and its thumbnail, and the same face choice
again when a stored identity is prepared for another model (`app.pipeline.face_choice`)."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np

from app.content.check import ContentRefused
from app.errors import UserError
from app.identity.eye_state import EyeOpenness
from app.identity.images import ImageInfo, ImageRejected, decode_image, encode_stored
from app.identity.photo_check import source_warnings
from app.identity.photo_choice import SourcePhoto, prepare_from_photos
from app.identity.store import Prepare
from app.pipeline.face_choice import FaceChoiceError, choose_face, enrolled_choice
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import PreparedSource
from app.pipeline.types import Face, Image

THUMB_SIZE = 160


@dataclass(frozen=True)
class Enrolment:
    info: ImageInfo  # of the first photo
    faces: int  # found in the first photo
    prepared: PreparedSource
    thumbnail: bytes  # of the photo the engine uses (the first one when it uses all)
    stored: bytes  # the first photo, decoded, as PNG: what the store keeps, never the uploaded bytes
    warnings: list[str]  # why this photo may swap badly (app.identity.photo_check); it is still enrolled
    extra_stored: list[bytes] = field(default_factory=list)  # the other photos, likewise
    photo_used: int | None = 0  # the photo the engine uses; None: all of them (a mean embedding)

    @property
    def stored_bytes(self) -> int:
        return len(self.stored) + sum(len(p) for p in self.extra_stored)


@dataclass(frozen=True)
class Upload:
    data: bytes
    filename: str | None = None


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


def enrol(
    pipeline: FramePipeline, data: bytes, max_pixels: int, face_index: int | None, eyes: EyeOpenness | None = None
) -> Enrolment:
    """Blocking (run it in an executor): decode, find faces, pick one, prepare it for the engine. A photo that
    cannot be enrolled is an ImageRejected with the HTTP status and reason. `eyes`: judge the eyes too
    (app.identity.photo_check)."""
    return enrol_photos(pipeline, [Upload(data)], max_pixels, face_index, eyes)


def _named(number: int, upload: Upload, count: int) -> str:
    if count == 1:
        return ""
    name = f" ({upload.filename[:60]})" if upload.filename else ""
    return f"photo {number}{name}: "


def enrol_photos(
    pipeline: FramePipeline,
    uploads: Sequence[Upload],
    max_pixels: int,
    face_index: int | None,
    eyes: EyeOpenness | None = None,
    screen: Callable[[Image], None] | None = None,
) -> Enrolment:
    """Like `enrol` for 1-10 photos of one person (each must show one face, or the face `face_index` picks):
    the engine gets their mean embedding or the most frontal, best-exposed one (app.identity.photo_choice). A
    photo that cannot be used is refused with its number and file name in the reason; nothing is kept.
    `screen`: the content gate, given each decoded photo before anything else is done with it
    (`ContentRefused` with the photo's number when it flags one)."""
    photos: list[SourcePhoto] = []
    infos: list[ImageInfo] = []
    counts: list[int] = []
    for number, upload in enumerate(uploads, 1):
        prefix = _named(number, upload, len(uploads))
        try:
            image, info = decode_image(upload.data, max_pixels)
        except ImageRejected as exc:
            raise ImageRejected(exc.status, prefix + str(exc)) from None
        if screen is not None:
            try:
                screen(image)
            except ContentRefused as exc:
                exc.photo = number if len(uploads) > 1 else None
                raise
        (faces,) = pipeline.detector.process([image])
        try:
            face = choose_face(faces, enrolled_choice(face_index))
        except FaceChoiceError as exc:
            raise ImageRejected(422, f"{prefix}{exc}") from None
        photos.append(SourcePhoto(image, face))
        infos.append(info)
        counts.append(len(faces))
    try:
        prepared, used = prepare_from_photos(pipeline.engine, photos)
    except UserError as exc:  # the engine cannot use this face (e.g. no dense landmarks on it)
        raise ImageRejected(422, str(exc)) from None
    shown = photos[used or 0]
    return Enrolment(
        infos[0],
        counts[0],
        prepared,
        thumbnail(shown.image, shown.face),
        encode_stored(photos[0].image),
        source_warnings(prepared, eyes),
        extra_stored=[encode_stored(p.image) for p in photos[1:]],
        photo_used=used,
    )


def re_preparer(pipeline: FramePipeline) -> Prepare:
    """How a stored identity is prepared again for the loaded model: the faces it was enrolled with, from every
    photo, as at enrolment."""

    def prepare(images: list[Image], face_index: int | None) -> PreparedSource:
        photos = []
        for image in images:
            (faces,) = pipeline.detector.process([image])
            photos.append(SourcePhoto(image, choose_face(faces, enrolled_choice(face_index))))
        return prepare_from_photos(pipeline.engine, photos)[0]

    return prepare
