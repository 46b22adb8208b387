"""Paste-back: warp each swapped crop into the frame, limited to the face's bounding region.

insightface warps the crop and its mask onto the whole frame for every face (cost grows with the frame);
here only the region the crop covers is touched, so the cost follows the face's size, not the frame's.
"""

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import cv2
import numpy as np

from app.pipeline.color import STATS_SIZE, lab_stats, transfer_color_u8
from app.pipeline.types import Image, Matrix

MaskShape = Literal["box", "ellipse"]


@dataclass(frozen=True)
class PasteConfig:
    mask: MaskShape = "box"  # box: the whole crop (models that redraw it); ellipse: the face alone
    margin: float = 0.04  # fraction of the crop left out at each edge, beyond the feather
    feather: float = 0.05  # Gaussian sigma of the feather, as a fraction of the crop size
    color_strength: float = 1.0  # 0 = no colour correction toward the target


@dataclass
class PasteItem:
    """One swapped face: `swapped` is a square crop; `matrix` maps frame -> swapped-crop pixels;
    `target` is the original aligned crop (any square size) for colour statistics."""

    swapped: Image
    matrix: Matrix
    target: Image
    # How much of each pixel of `swapped` the original frame keeps (float32 0..1, the crop's size): a hand in
    # front of the face (app.pipeline.occlusion); None: nothing in front.
    keep: np.ndarray | None = None


# The face proper in arcface_128 crops (eyes at y≈0.40, mouth at y≈0.72): brows to chin, cheek to cheek.
ELLIPSE_CENTRE = (0.5, 0.61)
ELLIPSE_AXES = (0.30, 0.32)


@lru_cache(maxsize=16)
def feather_mask(size: int, shape: MaskShape, margin: float, feather: float) -> np.ndarray:
    """A float32 [size,size] mask: 1 inside, 0 at the border, smooth in between."""
    sigma = max(0.5, size * feather)
    # Inset the solid part by the margin plus two sigmas of feather, so the ramp reaches zero inside the crop.
    edge = max(1, round(size * margin + 2 * sigma))
    mask = np.zeros((size, size), np.float32)
    if shape == "ellipse":
        centre = (round(ELLIPSE_CENTRE[0] * size), round(ELLIPSE_CENTRE[1] * size))
        axes = (round(ELLIPSE_AXES[0] * size), round(ELLIPSE_AXES[1] * size))
        cv2.ellipse(mask, centre, axes, 0.0, 0.0, 360.0, 1.0, thickness=-1)
        mask[:edge], mask[-edge:], mask[:, :edge], mask[:, -edge:] = 0.0, 0.0, 0.0, 0.0
    else:
        mask[edge:-edge, edge:-edge] = 1.0
    blurred = cv2.GaussianBlur(mask, (0, 0), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_CONSTANT)
    blurred[blurred < 5e-3] = 0.0  # an invisible step, so the border is exactly untouched
    blurred.setflags(write=False)
    return blurred


Box = tuple[int, int, int, int]


@lru_cache(maxsize=16)
def mask_support(size: int, shape: MaskShape, margin: float, feather: float) -> Box:
    """The box (x0, y0, x1, y1) in the crop outside which `feather_mask` is zero: only its image in the frame
    can change (the ellipse's is about 0.7 of the crop's area)."""
    mask = feather_mask(size, shape, margin, feather)
    rows, cols = np.flatnonzero(mask.max(axis=1) > 0), np.flatnonzero(mask.max(axis=0) > 0)
    if rows.size == 0:
        return 0, 0, 0, 0
    return int(cols[0]), int(rows[0]), int(cols[-1]) + 1, int(rows[-1]) + 1


# Bilinear sampling reaches one pixel beyond a point, two in OpenCV's fixed-point coordinates: a box of the crop
# is widened by this much wherever it decides what is read or written.
SAMPLE_REACH = 2


def crop_region(
    matrix: Matrix, size: int, frame_shape: tuple[int, ...], box: Box | None = None
) -> tuple[int, int, int, int] | None:
    """Bounding box (x0, y0, x1, y1) in the frame of a size×size crop placed by `matrix` (or of `box` within
    it), clipped."""
    inverse = cv2.invertAffineTransform(matrix)
    r = SAMPLE_REACH
    bx0, by0, bx1, by1 = (0, 0, size, size) if box is None else (box[0] - r, box[1] - r, box[2] + r, box[3] + r)
    corners = np.array([[bx0, by0], [bx1, by0], [bx0, by1], [bx1, by1]], np.float64)
    mapped = corners @ inverse[:, :2].T + inverse[:, 2]
    height, width = frame_shape[:2]
    x0 = max(0, int(np.floor(mapped[:, 0].min())))
    y0 = max(0, int(np.floor(mapped[:, 1].min())))
    x1 = min(width, int(np.ceil(mapped[:, 0].max())) + 1)
    y1 = min(height, int(np.ceil(mapped[:, 1].max())) + 1)
    if x1 <= x0 or y1 <= y0:
        return None
    return x0, y0, x1, y1


def _thumbnail(crop: Image, mask_for: Callable[[int], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    size = crop.shape[0]
    if size <= STATS_SIZE:
        return crop, mask_for(size)
    small = cv2.resize(crop, (STATS_SIZE, STATS_SIZE), interpolation=cv2.INTER_AREA)
    return small, mask_for(STATS_SIZE)


class PasteBack:
    """Stage: (frame, its swapped faces) -> a new frame with the faces blended in."""

    name = "paste"

    def __init__(self, config: PasteConfig | None = None) -> None:
        self.config = config or PasteConfig()

    def _mask(self, size: int) -> np.ndarray:
        return feather_mask(size, self.config.mask, self.config.margin, self.config.feather)

    def corrected(self, item: PasteItem, box: Box | None = None) -> Image:
        """The swapped crop (or its `box`), colour-matched to the target under the face mask."""
        part = item.swapped if box is None else item.swapped[box[1] : box[3], box[0] : box[2]]
        if self.config.color_strength <= 0:
            return part
        swapped_stats = lab_stats(*_thumbnail(item.swapped, self._mask))
        target_stats = lab_stats(*_thumbnail(item.target, self._mask))
        return transfer_color_u8(part, swapped_stats, target_stats, self.config.color_strength)

    def paste(self, frame: Image, items: list[PasteItem]) -> Image:
        out = frame.copy()
        for item in items:
            size = item.swapped.shape[0]
            support = mask_support(size, self.config.mask, self.config.margin, self.config.feather)
            region = crop_region(item.matrix, size, out.shape, support)
            if region is None:
                continue
            x0, y0, x1, y1 = region
            # Only the support (and what bilinear sampling reaches beyond it) is colour-matched and warped.
            sx0, sy0 = max(0, support[0] - SAMPLE_REACH), max(0, support[1] - SAMPLE_REACH)
            sx1, sy1 = min(size, support[2] + SAMPLE_REACH), min(size, support[3] + SAMPLE_REACH)
            # Inverse warp from the support's box straight into the region: shift by both origins.
            inverse = np.asarray(cv2.invertAffineTransform(item.matrix), np.float64)
            inverse[:, 2] += inverse[:, :2] @ np.array([sx0, sy0], np.float64) - np.array([x0, y0], np.float64)
            dsize = (x1 - x0, y1 - y0)
            # Warped and blended in uint8 by OpenCV: 8x cheaper than float numpy on a 720p face (7.8 -> 1.0 ms
            # per face on one core), within one grey level of it.
            part = self.corrected(item, (sx0, sy0, sx1, sy1))
            face = cv2.warpAffine(part, inverse, dsize, flags=cv2.INTER_LINEAR)
            mask = self._mask(size)[sy0:sy1, sx0:sx1]
            if item.keep is not None:
                mask = mask * (1.0 - item.keep[sy0:sy1, sx0:sx1])
            alpha = np.asarray(cv2.warpAffine(mask, inverse, dsize, flags=cv2.INTER_LINEAR), np.float32)
            roi = out[y0:y1, x0:x1]
            out[y0:y1, x0:x1] = cv2.blendLinear(face, roi, alpha, 1.0 - alpha)
        return out

    def process(self, batch: list[tuple[Image, list[PasteItem]]]) -> list[Image]:
        return [self.paste(frame, items) for frame, items in batch]
