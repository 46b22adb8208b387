"""Work on a decoded YUV 4:2:0 frame in place: a scaled BGR view for the detector in one conversion, and BGR
copies of face regions only, written back into the frame's planes.

A camera frame arrives as yuv420p and leaves as yuv420p for the encoder; converting the whole frame to BGR
and back costs two full-frame conversions per frame when only the faces change. These helpers convert the
face regions alone (`swapcast bench-encoder` measures both ways side by side, `colour_conversion`).
Regions are aligned to even pixels so that each covers whole chroma samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import av
import cv2
import numpy as np
import numpy.typing as npt

from app.live.frame import OutputFrame, to_i420
from app.pipeline.types import Image

Plane = npt.NDArray[np.uint8]


@dataclass(frozen=True)
class Region:
    """An even-aligned rectangle of a frame: x0, y0 inclusive, x1, y1 exclusive."""

    x0: int
    y0: int
    x1: int
    y1: int

    @property
    def width(self) -> int:
        return self.x1 - self.x0

    @property
    def height(self) -> int:
        return self.y1 - self.y0


def planes(frame: av.VideoFrame) -> tuple[Plane, Plane, Plane]:
    """Writable views of a yuv420p frame's Y, U and V planes (their padding cut off)."""
    if frame.format.name != "yuv420p":
        raise ValueError(f"expected a yuv420p frame, got {frame.format.name}")
    views = []
    for index, (width, height) in enumerate(
        (
            (frame.width, frame.height),
            ((frame.width + 1) // 2, (frame.height + 1) // 2),
            ((frame.width + 1) // 2, (frame.height + 1) // 2),
        )
    ):
        plane = frame.planes[index]
        rows = np.frombuffer(memoryview(plane), np.uint8)[: plane.line_size * height].reshape(height, plane.line_size)
        views.append(rows[:, :width])
    return views[0], views[1], views[2]


def region(box: npt.ArrayLike, width: int, height: int, margin: float = 0.0) -> Region:
    """The even-aligned region covering `box` (x0, y0, x1, y1) grown by `margin` of its size each side,
    clipped to the frame."""
    x0, y0, x1, y1 = (float(v) for v in np.asarray(box, np.float64)[:4])
    grow_x, grow_y = (x1 - x0) * margin, (y1 - y0) * margin
    left = max(0, int(np.floor(x0 - grow_x)) & ~1)
    top = max(0, int(np.floor(y0 - grow_y)) & ~1)
    right = min(width & ~1, (int(np.ceil(x1 + grow_x)) + 1) & ~1)
    bottom = min(height & ~1, (int(np.ceil(y1 + grow_y)) + 1) & ~1)
    return Region(left, top, max(left, right), max(top, bottom))


def read_bgr(frame: av.VideoFrame, area: Region) -> Image:
    """A BGR copy of one region of a yuv420p frame."""
    y, u, v = planes(frame)
    cy0, cy1, cx0, cx1 = area.y0 // 2, area.y1 // 2, area.x0 // 2, area.x1 // 2
    i420 = np.concatenate(
        [
            y[area.y0 : area.y1, area.x0 : area.x1].reshape(-1),
            u[cy0:cy1, cx0:cx1].reshape(-1),
            v[cy0:cy1, cx0:cx1].reshape(-1),
        ]
    ).reshape(area.height * 3 // 2, area.width)
    return np.asarray(cv2.cvtColor(i420, cv2.COLOR_YUV2BGR_I420), np.uint8)


def write_bgr(frame: av.VideoFrame, area: Region, image: Image) -> None:
    """Write a BGR region (the size of `area`) back into the frame's planes."""
    if image.shape[:2] != (area.height, area.width):
        raise ValueError(f"region is {area.width}x{area.height}, image is {image.shape[1]}x{image.shape[0]}")
    i420 = to_i420(image).reshape(-1)
    y, u, v = planes(frame)
    luma = area.width * area.height
    chroma = luma // 4
    cy0, cy1, cx0, cx1 = area.y0 // 2, area.y1 // 2, area.x0 // 2, area.x1 // 2
    y[area.y0 : area.y1, area.x0 : area.x1] = i420[:luma].reshape(area.height, area.width)
    u[cy0:cy1, cx0:cx1] = i420[luma : luma + chroma].reshape(area.height // 2, area.width // 2)
    v[cy0:cy1, cx0:cx1] = i420[luma + chroma :].reshape(area.height // 2, area.width // 2)


def detector_input(frame: av.VideoFrame, max_side: int) -> tuple[Image, float]:
    """The frame as BGR, scaled down so that its longer side is at most `max_side`, in one conversion; and
    the scale (detections on it divide by it to land in frame coordinates)."""
    scale = min(1.0, max_side / max(frame.width, frame.height))
    width, height = max(2, round(frame.width * scale)), max(2, round(frame.height * scale))
    image = frame.reformat(width=width, height=height, format="bgr24").to_ndarray()
    return np.asarray(image, np.uint8), scale


def to_frame(image: Image | OutputFrame) -> av.VideoFrame:
    """A BGR image as the yuv420p frame encoders take, converted by OpenCV: libswscale's BGR to YUV path, which
    the encoder would otherwise run on a bgr24 frame, took twice as long (1.5 vs 0.7 ms at 480p, 4.3 vs 2.0 ms
    at 720p, one core). Odd sizes, which 4:2:0 cannot hold whole, stay bgr24 for the encoder to convert. An
    `OutputFrame` gives its planes, converted once for every output."""
    frame = OutputFrame.of(image)
    if not frame.even:
        return av.VideoFrame.from_ndarray(np.ascontiguousarray(frame.image), format="bgr24")
    return av.VideoFrame.from_ndarray(frame.i420(), format="yuv420p")
