"""Covering a face that is lost: pixelate the region where it was last seen, so it is never shown unswapped.

Coarse blocks (8 across the face) hide who it is and cost well under a millisecond at any face size: one
area-averaging shrink and one nearest-neighbour enlargement of the region alone.
"""

import cv2
import numpy as np

from app.pipeline.types import Face, Image

COVER_MARGIN = 0.35  # grown by this fraction of the box on each side: the head around the detected face
COVER_BLOCKS = 8  # blocks across the covered region


def cover_region(face: Face, frame_shape: tuple[int, ...]) -> tuple[int, int, int, int] | None:
    """(x0, y0, x1, y1) of the region covering `face`, clipped to the frame; None when outside it."""
    x0, y0, x1, y1 = (float(v) for v in face.box)
    grow_x, grow_y = COVER_MARGIN * (x1 - x0), COVER_MARGIN * (y1 - y0)
    height, width = frame_shape[:2]
    left, top = max(0, int(np.floor(x0 - grow_x))), max(0, int(np.floor(y0 - grow_y)))
    right, bottom = min(width, int(np.ceil(x1 + grow_x))), min(height, int(np.ceil(y1 + grow_y)))
    if right - left < 2 or bottom - top < 2:
        return None
    return left, top, right, bottom


def pixelate(frame: Image, faces: list[Face]) -> Image:
    """`frame` with the region of each of `faces` pixelated (a new image when there is any)."""
    if not faces:
        return frame
    out = frame.copy()
    for face in faces:
        region = cover_region(face, out.shape)
        if region is None:
            continue
        x0, y0, x1, y1 = region
        roi = out[y0:y1, x0:x1]
        scale = COVER_BLOCKS / max(roi.shape[0], roi.shape[1])
        small = cv2.resize(
            roi,
            (max(1, round(roi.shape[1] * scale)), max(1, round(roi.shape[0] * scale))),
            interpolation=cv2.INTER_AREA,
        )
        out[y0:y1, x0:x1] = cv2.resize(small, (roi.shape[1], roi.shape[0]), interpolation=cv2.INTER_NEAREST)
    return out
