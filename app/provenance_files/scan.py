"""Reading a file, a still image or a live RTSP pull and deciding, second by second, whether it is marked."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import av

from app.errors import UserError
from app.media.rtsp_in import LIVE_OPTIONS
from app.pipeline.types import Image
from app.provenance.code import MarkCode
from app.provenance.detect import Detection, best_of, detect_windows

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
OPEN_TIMEOUT_S = 10.0


@dataclass
class ScanResult:
    best: Detection
    windows: int
    fps: float
    source: str


def _live_frames(url: str, seconds: float) -> tuple[float, Iterator[Image]]:
    try:
        container = av.open(url, options=LIVE_OPTIONS, timeout=OPEN_TIMEOUT_S)
    except (av.error.FFmpegError, OSError) as exc:
        raise UserError(f"cannot read {url}: {exc}") from None
    if not container.streams.video:
        container.close()
        raise UserError(f"{url}: no video stream")
    stream = container.streams.video[0]
    rate = stream.average_rate or stream.guessed_rate
    fps = float(rate) if rate else 30.0
    max_frames = max(1, math.ceil(seconds * fps))

    def frames() -> Iterator[Image]:
        try:
            decoded = (f.to_ndarray(format="bgr24") for f in container.decode(stream))
            yield from itertools.islice(decoded, max_frames)
        except av.error.FFmpegError as exc:
            raise UserError(f"{url}: the stream broke off ({exc})") from None
        finally:
            container.close()

    return fps, frames()


def _file_frames(path: Path, seconds: float) -> tuple[float, Iterator[Image]]:
    from app.media.video_file import probe, read_frames, read_image

    if not path.is_file():
        raise UserError(f"file not found: {path}")
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return 1.0, iter([read_image(path)])
    info = probe(path)
    fps = float(info.fps)
    return fps, itertools.islice(read_frames(path), max(1, math.ceil(seconds * fps)))


def scan(source: str, code: MarkCode, *, seconds: float = 10.0) -> ScanResult:
    """Up to `seconds` of `source` (a file path or an rtsp:// URL), one decision per second of video."""
    if seconds <= 0:
        raise UserError("--seconds must be above 0")
    if source.startswith(("rtsp://", "rtsps://")):
        fps, frames = _live_frames(source, seconds)
    else:
        fps, frames = _file_frames(Path(source), seconds)
    window = max(1, round(fps))
    detections = detect_windows(frames, code, window=window)
    best = best_of(detections)
    if best is None:
        raise UserError(f"{source}: no frames to read")
    return ScanResult(best=best, windows=len(detections), fps=fps, source=source)
