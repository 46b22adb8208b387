"""A `swapcast cam` sink that records what a virtual camera would have been handed, for tests."""

from __future__ import annotations

import threading

from app.media.frame_ids import read_stamp
from app.pipeline.types import Image

KEPT_IMAGES = 60


class RecordingSink:
    """Every frame's stamp, the first frames themselves, and the threads it was called on."""

    pixel_format = "bgr24"

    def __init__(self) -> None:
        self.size: tuple[int, int] | None = None
        self.stamps: list[int | None] = []
        self.images: list[Image] = []
        self.closed = False
        self.threads: set[str] = set()

    def open(self, width: int, height: int, fps: float) -> None:
        self.size = (width, height)
        self.threads.add(threading.current_thread().name)

    def show(self, image: Image) -> None:
        assert (image.shape[1], image.shape[0]) == self.size
        self.threads.add(threading.current_thread().name)
        self.stamps.append(read_stamp(image))
        if len(self.images) < KEPT_IMAGES:
            self.images.append(image.copy())

    def close(self) -> None:
        self.closed = True
