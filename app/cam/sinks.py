"""Where the swapped picture goes: a virtual camera (pyvirtualcam, an optional extra) or an OpenCV window.

A sink is opened, fed and closed on one thread (the sink worker's), never on the event loop: window toolkits
want one thread, and a virtual camera's write may block. Opening checks everything the sink needs, so that a
missing piece ends the command before it connects."""

from __future__ import annotations

import sys
from typing import Any, Protocol

import cv2
import numpy as np

from app.errors import UserError
from app.pipeline.types import Image

OUTPUTS = ("virtual", "window", "none")

INSTALL_EXTRA = "pip install 'swapcast[cam]'"


class Sink(Protocol):
    """Takes frames of a fixed size in `pixel_format` (as PyAV names it)."""

    pixel_format: str

    def open(self, width: int, height: int, fps: float) -> None: ...

    def show(self, image: Image) -> None: ...

    def close(self) -> None: ...


def no_backend_advice(platform: str = sys.platform) -> str:
    """What to install or load when pyvirtualcam finds no virtual camera on `platform`."""
    if platform.startswith("linux"):
        return (
            "load the v4l2loopback kernel module: sudo modprobe v4l2loopback devices=1 exclusive_caps=1 "
            "card_label=swapcast (package v4l2loopback-dkms)"
        )
    return "install OBS Studio (28 or later) for its virtual camera, and start its virtual camera once"


class VirtualCamera:
    """A virtual camera the call apps list (v4l2loopback on Linux, OBS's on Windows and macOS)."""

    pixel_format = "rgb24"

    def __init__(self, device: str | None = None) -> None:
        self.device = device
        self._camera: Any = None

    def open(self, width: int, height: int, fps: float) -> None:
        try:
            import pyvirtualcam
        except ImportError:
            raise UserError(f"--output virtual needs pyvirtualcam: {INSTALL_EXTRA}") from None
        try:
            self._camera = pyvirtualcam.Camera(width, height, fps, fmt=pyvirtualcam.PixelFormat.RGB, device=self.device)
        except RuntimeError as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise UserError(f"no virtual camera ({reason}): {no_backend_advice()}") from None

    @property
    def name(self) -> str:
        return str(self._camera.device) if self._camera is not None else "virtual camera"

    def show(self, image: Image) -> None:
        self._camera.send(image)

    def close(self) -> None:
        if self._camera is not None:
            self._camera.close()
            self._camera = None


class Window:
    """An OpenCV window (needs OpenCV with GUI support: opencv-python, not opencv-python-headless)."""

    pixel_format = "bgr24"
    title = "swapcast"

    def open(self, width: int, height: int, fps: float) -> None:
        try:
            cv2.namedWindow(self.title, cv2.WINDOW_NORMAL)
            cv2.resizeWindow(self.title, width, height)
        except cv2.error:
            raise UserError(
                "--output window needs OpenCV with GUI support and a display; this OpenCV has none "
                "(opencv-python-headless): pip install opencv-python, or use --output virtual"
            ) from None

    def show(self, image: Image) -> None:
        cv2.imshow(self.title, image)
        cv2.waitKey(1)

    def close(self) -> None:
        cv2.destroyAllWindows()


class Discard:
    """Shows nothing: measures the link (with --measure) without a virtual camera or a display."""

    pixel_format = "gray"  # the cheapest conversion that still carries the stamp

    def open(self, width: int, height: int, fps: float) -> None:
        pass

    def show(self, image: Image) -> None:
        pass

    def close(self) -> None:
        pass


def make_sink(output: str) -> Sink:
    sinks: dict[str, type[Sink]] = {"virtual": VirtualCamera, "window": Window, "none": Discard}
    return sinks[output]()


def fit(image: Image, width: int, height: int) -> Image:
    """`image` at the sink's size: the server's adaptive encoder may send fewer pixels than the camera has."""
    if image.shape[1] == width and image.shape[0] == height:
        return image
    return np.ascontiguousarray(cv2.resize(image, (width, height), interpolation=cv2.INTER_LINEAR))
