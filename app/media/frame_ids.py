"""Frame ids written into pixels and read back from what returns: a frame's round trip through a server that
re-encodes it, measured without any side channel.

The stamp is 16 black or white 16x16 blocks (12 bits of frame id, 4 bits of check) in the top-left corner,
coarse enough to survive VP8 and H.264 at their default bitrates.
"""

from __future__ import annotations

import av
import numpy as np

from app.pipeline.types import Image

BLOCK = 16
COLUMNS = 8
ROWS = 2
MARGIN = 8
ID_BITS = 12
ID_MODULO = 1 << ID_BITS

STAMP_BOX = (MARGIN, MARGIN, MARGIN + COLUMNS * BLOCK, MARGIN + ROWS * BLOCK)  # x1, y1, x2, y2


def _check(value: int) -> int:
    return (value ^ (value >> 4) ^ (value >> 8) ^ 0b1010) & 0xF


def stamp(image: Image, frame_id: int) -> None:
    """Write `frame_id` (mod 4096) into the image's top-left corner, in place."""
    value = frame_id % ID_MODULO
    word = (value << 4) | _check(value)
    for bit in range(COLUMNS * ROWS):
        row, col = divmod(bit, COLUMNS)
        y, x = MARGIN + row * BLOCK, MARGIN + col * BLOCK
        on = (word >> (15 - bit)) & 1
        image[y : y + BLOCK, x : x + BLOCK] = 255 if on else 0


def read_stamp(image: Image) -> int | None:
    """The frame id stamped in the image, or None when the stamp is missing or damaged."""
    if image.shape[0] < STAMP_BOX[3] or image.shape[1] < STAMP_BOX[2]:
        return None
    grey = image[..., :3].mean(axis=2) if image.ndim == 3 else image
    word = 0
    for bit in range(COLUMNS * ROWS):
        row, col = divmod(bit, COLUMNS)
        y, x = MARGIN + row * BLOCK + 4, MARGIN + col * BLOCK + 4
        level = float(grey[y : y + BLOCK - 8, x : x + BLOCK - 8].mean())
        if 64 < level < 192:
            return None
        word = (word << 1) | int(level >= 128)
    value = word >> 4
    return value if (word & 0xF) == _check(value) else None


def luma(frame: av.VideoFrame) -> Image:
    """The frame's brightness plane without a colour conversion (cheap enough for every frame)."""
    if frame.format.name in ("yuv420p", "yuvj420p", "nv12"):
        plane = frame.planes[0]
        rows = np.frombuffer(memoryview(plane), np.uint8).reshape(plane.height, plane.line_size)
        return rows[:, : plane.width]
    return np.asarray(frame.to_ndarray(format="gray"), np.uint8)
