"""Peak memory and time of decoding hostile identity photos, each in a fresh process.

Each image is made by one child process and written to a file; a second, fresh child reads it and decodes it (and
re-encodes it for the store) exactly as an upload is, and its peak resident size (VmHWM, reset just before) is that
image's alone. The child's size before decoding (imports and the file's bytes) is reported too: the decode's own cost is
`decode_rss_mb`.
"""

import contextlib
import io
import multiprocessing
import resource
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image as PilImage

from app.identity.images import ImageRejected, decode_image, encode_stored


@dataclass(frozen=True)
class UploadCost:
    image: str
    bytes: int
    status: int  # 201-like 200 when accepted, else the refusal's status
    detail: str
    seconds: float
    base_rss_mb: float
    peak_rss_mb: float

    @property
    def decode_rss_mb(self) -> float:
        return round(self.peak_rss_mb - self.base_rss_mb, 1)


def _png(pixels: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".png", pixels, [cv2.IMWRITE_PNG_COMPRESSION, 9])
    assert ok
    return data.tobytes()


def _jpeg(pixels: np.ndarray) -> bytes:
    ok, data = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, 90])
    assert ok
    return data.tobytes()


def _palette_png(side: int) -> bytes:
    buffer = io.BytesIO()
    PilImage.new("P", (side, side), 3).save(buffer, format="PNG", optimize=True)
    return buffer.getvalue()


def _rgba_png(side: int) -> bytes:
    buffer = io.BytesIO()
    PilImage.new("RGBA", (side, side), (200, 120, 90, 128)).save(buffer, format="PNG")
    return buffer.getvalue()


def _textured(width: int, height: int) -> np.ndarray:
    """Cheap to compress but not flat: horizontal and vertical ramps."""
    x = (np.arange(width, dtype=np.uint32) % 256).astype(np.uint8)
    y = (np.arange(height, dtype=np.uint32) % 256).astype(np.uint8)[:, None]
    return np.ascontiguousarray(
        np.stack(
            [
                np.broadcast_to(x, (height, width)),
                np.broadcast_to(y, (height, width)),
                np.full((height, width), 90, np.uint8),
            ],
            axis=2,
        )
    )


def hostile_images(max_pixels: int) -> dict[str, Callable[[], bytes]]:
    """Name -> a maker of the image bytes (made in the child, so the parent stays small)."""
    side = int(max_pixels**0.5)
    return {
        "png-6300x6300-flat": lambda: _png(np.zeros((6300, 6300, 3), np.uint8)),
        f"png-{side}x{side}-ramps": lambda: _png(_textured(side, side)),
        f"jpeg-{side}x{side}-ramps": lambda: _jpeg(_textured(side, side)),
        f"png16-grey-{side}x{side}": lambda: _png(np.full((side, side), 30000, np.uint16)),
        f"png-palette-{side}x{side}": lambda: _palette_png(side),
        f"png-rgba-{side}x{side}": lambda: _rgba_png(side),
        "png-1280x1-strip": lambda: _png(np.zeros((1, 1280, 3), np.uint8)),
        "jpeg-640x480-10mb-trailer": lambda: _jpeg(_textured(640, 480)) + b"\x00" * 10_000_000,
    }


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    """Start the peak (VmHWM) again from the current size, so the imports' own peak does not hide the decode's."""
    with contextlib.suppress(OSError):  # not Linux, or not allowed: the peak then includes start-up
        Path("/proc/self/clear_refs").write_text("5")


def _peak_mb() -> float:
    try:
        return _status_mb("VmHWM")
    except (OSError, RuntimeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _make(name: str, max_pixels: int, path: str) -> None:
    Path(path).write_bytes(hostile_images(max_pixels)[name]())


def _measure(name: str, max_pixels: int, path: str) -> UploadCost:
    data = Path(path).read_bytes()
    _reset_peak()
    base = _status_mb("VmRSS")
    start = time.perf_counter()
    try:
        image, _ = decode_image(data, max_pixels)
        encode_stored(image)
        status, detail = 200, f"decoded to {image.shape[1]}x{image.shape[0]}"
    except ImageRejected as exc:
        status, detail = exc.status, str(exc)
    seconds = time.perf_counter() - start
    return UploadCost(name, len(data), status, detail, round(seconds, 3), round(base, 1), round(_peak_mb(), 1))


def run_upload_bench(max_pixels: int, names: tuple[str, ...] | None = None) -> dict[str, Any]:
    """One fresh process per image (all of them, or those whose name starts with one of `names`): its peak RSS is
    that image's alone."""
    context = multiprocessing.get_context("spawn")
    rows = []
    with tempfile.TemporaryDirectory(prefix="swapcast-bench-upload-") as tmp:
        for name in hostile_images(max_pixels):
            if names is not None and not name.startswith(names):
                continue
            path = str(Path(tmp) / "image")
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                pool.submit(_make, name, max_pixels, path).result()
            with ProcessPoolExecutor(1, mp_context=context) as pool:
                cost = pool.submit(_measure, name, max_pixels, path).result()
            rows.append(asdict(cost) | {"decode_rss_mb": cost.decode_rss_mb})
    accepted = [r["decode_rss_mb"] for r in rows if r["status"] == 200]
    return {
        "max_image_pixels": max_pixels,
        "images": rows,
        "max_decode_rss_mb_accepted": round(max(accepted), 1) if accepted else None,
        "max_peak_rss_mb": round(max(r["peak_rss_mb"] for r in rows), 1),
    }
