"""The local picture: a camera through PyAV's capture input for this platform, or a video file played at its own
rate, looping. A reader thread decodes; only the newest frame waits for the sender, so a slow link never builds
a queue."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import av

from app.errors import UserError
from app.media.mailbox import Mailbox


@dataclass(frozen=True)
class CaptureInput:
    """How PyAV opens a camera on one platform."""

    format: str
    device: str


def capture_input(camera: str, platform: str = sys.platform) -> CaptureInput:
    """The capture format and device name for `camera` (a path, index or device name) on `platform`."""
    if platform.startswith("linux"):
        return CaptureInput("v4l2", f"/dev/video{camera}" if camera.isdigit() else camera)
    if platform == "darwin":
        return CaptureInput("avfoundation", camera if ":" in camera else f"{camera}:none")  # picture, no sound
    if platform == "win32":
        return CaptureInput("dshow", camera if camera.startswith("video=") else f"video={camera}")
    raise UserError(f"no camera capture on {platform}; pass a video file with --camera")


def is_device(camera: str, platform: str = sys.platform) -> bool:
    """A camera rather than a file: an index, a V4L2 device node, or a name where there is no such file."""
    if camera.isdigit() or camera.startswith("/dev/video"):
        return True
    return platform in ("darwin", "win32") and not Path(camera).exists()


@dataclass
class CapturedFrame:
    frame: av.VideoFrame
    read_at: float  # monotonic clock, when the reader had it


class Camera:
    """Reads `source` on a thread of its own; `next_frame` gives the newest frame not yet taken."""

    def __init__(self, source: str, *, size: tuple[int, int] | None = None, fps: int | None = None) -> None:
        self.source = source
        self.size = size
        self.device = is_device(source)
        self.container = self._open(fps)
        stream = self.container.streams.video[0]
        self.fps = float(stream.average_rate or stream.guessed_rate or fps or 30)
        self.width, self.height = (
            size if size is not None else (stream.codec_context.width, stream.codec_context.height)
        )
        self.read = 0
        self._slot: Mailbox[CapturedFrame] = Mailbox()
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrived: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    def _open(self, fps: int | None) -> av.container.InputContainer:
        try:
            if not self.device:
                if not Path(self.source).is_file():
                    raise UserError(f"no such camera or video file: {self.source}")
                container = av.open(self.source)
            else:
                where = capture_input(self.source)
                options = {"framerate": str(fps or 30)}
                if self.size is not None:
                    options["video_size"] = f"{self.size[0]}x{self.size[1]}"
                container = av.open(where.device, format=where.format, options=options)
        except (av.FFmpegError, OSError) as exc:
            raise UserError(f"cannot open camera {self.source}: {exc}") from None
        if not container.streams.video:
            container.close()
            raise UserError(f"{self.source} has no video")
        return container

    def start(self) -> None:
        """Start reading; must be called on the event loop that awaits `next_frame`."""
        self._loop = asyncio.get_running_loop()
        self._arrived = asyncio.Event()
        self._thread = threading.Thread(target=self._run, name="cam-reader", daemon=True)
        self._thread.start()

    async def next_frame(self) -> CapturedFrame:
        """The newest frame read since the previous call (waits for one); raises UserError when reading failed."""
        assert self._arrived is not None, "start() first"
        while True:
            item = self._slot.take()
            if item is not None:
                return item
            if self.error is not None:
                raise UserError(self.error)
            self._arrived.clear()
            await self._arrived.wait()

    def stop(self) -> None:
        """Stop reading (before the event loop that awaits `next_frame` closes)."""
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.container.close()

    def _hand_over(self, item: CapturedFrame | None) -> None:
        if item is not None:
            self._slot.put(item)
        assert self._loop is not None and self._arrived is not None
        if not self._stop.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed while this frame was read: nobody waits
                self._loop.call_soon_threadsafe(self._arrived.set)

    def _run(self) -> None:
        try:
            self._read_loop()
        except Exception as exc:  # the camera went away, the file broke: the command ends with the reason
            self.error = f"reading {self.source} failed: {exc}"
            self._hand_over(None)

    def _read_loop(self) -> None:
        stream = self.container.streams.video[0]
        started: float | None = None
        played = 0.0  # the file's time already played in earlier loops
        while not self._stop.is_set():
            last = 0.0
            for frame in self.container.decode(stream):
                if self._stop.is_set():
                    return
                if not self.device:  # a file plays at its own rate
                    at = float(frame.time) if frame.time is not None else last + 1 / self.fps
                    last = at
                    now = time.monotonic()
                    started = now if started is None else started
                    wait = started + played + at - now
                    if wait > 0:
                        time.sleep(wait)
                if self.size is not None and (frame.width, frame.height) != self.size:
                    frame = frame.reformat(width=self.size[0], height=self.size[1])
                self.read += 1
                self._hand_over(CapturedFrame(frame, time.monotonic()))
            if self.device:
                raise RuntimeError("the camera stopped sending")
            played += last + 1 / self.fps
            self.container.seek(0)
