"""Whether a picture is unchanged since it was last scored: a check of the same picture would only repeat the same
score, so the live gate may skip it (app.content.live).

A picture's look is its 32 x 32 thumbnail (area averages, so sensor noise and sub-pixel drift average out). It
counts as changed when any thumbnail cell moved by more than `TOLERANCE` grey levels in any colour: something
that covers a thirty-second of the frame's width and height, or a global change of light, is enough.
"""

import cv2
import numpy as np

from app.pipeline.types import Image

LOOK_SIZE = 32
# Largest change of one cell (grey levels, 0-255) that still counts as the same picture. Measured on 720p clips
# of the sample photos (docs/guides/content-gate.md): noise of 2 levels and a drift of a pixel move cells by at
# most 7 levels (at the sharpest edges); a second of a slow pan and zoom by 60-250.
TOLERANCE = 10.0


def look(image: Image) -> np.ndarray:
    """`image` as its LOOK_SIZE x LOOK_SIZE thumbnail, float32."""
    small = cv2.resize(np.ascontiguousarray(image), (LOOK_SIZE, LOOK_SIZE), interpolation=cv2.INTER_AREA)
    return np.asarray(small, np.float32)


def change(before: np.ndarray, after: np.ndarray) -> float:
    """The largest change of one thumbnail cell in one colour, grey levels."""
    return float(np.abs(after - before).max())


def unchanged(before: np.ndarray, after: np.ndarray, tolerance: float = TOLERANCE) -> bool:
    return change(before, after) <= tolerance
