"""`OutputFrame`: one processed frame as every output takes it. The BGR image, and its I420 planes converted
once, by whichever output needs them first, for all of them: the WebRTC return, WHEP viewers, the RTSP path
and a channel each encode from I420, and with every output on a frame used to be converted three times."""

from __future__ import annotations

import threading

import cv2
import numpy as np
import numpy.typing as npt

from app.pipeline.types import Image

Planes = npt.NDArray[np.uint8]


def to_i420(image: Image) -> Planes:
    """A BGR image (even width and height) as one planar I420 buffer: [height * 3 / 2, width], Y then U then V."""
    return np.asarray(cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_BGR2YUV_I420), np.uint8)


def letterbox(image: Image, width: int, height: int) -> Image:
    """`image` scaled to fit `width`x`height` with its shape kept, centred on black: the one size rule of every
    output that has a size of its own (a channel, a shared encode's rendition)."""
    h, w = image.shape[:2]
    if (w, h) == (width, height):
        return image
    scale = min(width / w, height / h)
    new_w, new_h = max(1, round(w * scale)), max(1, round(h * scale))
    resized = cv2.resize(image, (new_w, new_h), interpolation=cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR)
    out = np.zeros((height, width, 3), np.uint8)
    top, left = (height - new_h) // 2, (width - new_w) // 2
    out[top : top + new_h, left : left + new_w] = resized
    return out


class OutputFrame:
    __slots__ = ("image", "_i420", "_lock")

    def __init__(self, image: Image) -> None:
        self.image = image
        self._i420: Planes | None = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, frame: Image | OutputFrame) -> OutputFrame:
        return frame if isinstance(frame, OutputFrame) else cls(frame)

    @property
    def size(self) -> tuple[int, int]:
        """(width, height)."""
        return self.image.shape[1], self.image.shape[0]

    @property
    def even(self) -> bool:
        """Whether 4:2:0 holds the frame whole (both sides even)."""
        width, height = self.size
        return width % 2 == 0 and height % 2 == 0

    def i420(self) -> Planes:
        """The I420 planes (an even-sized frame only), converted on the first call; read-only afterwards."""
        with self._lock:
            if self._i420 is None:
                if not self.even:
                    raise ValueError(f"a {self.size[0]}x{self.size[1]} frame has no whole I420 form")
                self._i420 = to_i420(self.image)
            return self._i420
