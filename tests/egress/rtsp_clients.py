"""The RTSP client the egress tests pull paths with: PyAV with the low-delay options an OBS media source uses."""

import time
from collections.abc import Callable

import av
import numpy as np

from app.media.rtsp_in import LIVE_OPTIONS
from app.pipeline.types import Image


def pull(url: str, count: int, on_frame: Callable[[int], None] | None = None) -> list[tuple[float, Image]]:
    """Decode `count` frames from `url` as a low-delay PyAV client: (arrival time, BGR image) each."""
    frames: list[tuple[float, Image]] = []
    with av.open(url, options=LIVE_OPTIONS, timeout=(15.0, 10.0)) as container:
        for frame in container.decode(video=0):
            frames.append((time.monotonic(), np.asarray(frame.to_ndarray(format="bgr24"), dtype=np.uint8)))
            if on_frame is not None:
                on_frame(len(frames))
            if len(frames) == count:
                break
    return frames
