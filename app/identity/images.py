"""Checks on uploaded identity photos: the format from magic bytes, the pixel count and shape from the header
before any decoding, then a strict decode (truncated files are refused, not padded with grey) that is bounded in
memory: JPEGs decode reduced in the DCT, every photo is scaled to `MAX_SIDE` before it is converted, and at most
`decode_slots` photos decode at once. What is stored is `encode_stored` of the decoded pixels, never the upload.
"""

import io
import re
import threading
import warnings
from dataclasses import dataclass

import cv2
import numpy as np
from PIL import Image as PilImage
from PIL import ImageOps, UnidentifiedImageError

from app.errors import StatusError
from app.pipeline.types import Image

FORMATS = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}
_PIL_NAMES = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp"}
# The long side a photo is decoded to: the detector looks at 640 pixels and engines at aligned crops of 128-256,
# so a face in a group photo keeps enough pixels. Below half of 4000 so a 4000-pixel JPEG decodes at half size in
# the DCT and a 4000-pixel PNG box-reduces by 2 before filtering (`swapcast bench-upload`).
MAX_SIDE = 1920
# Longer thin strips have no room for a face and break resizing (a 1280x1 photo scales to a width of 0).
MAX_ASPECT = 16
_SIXTEEN_BIT = ("I;16", "I;16B", "I;16L", "I;16N", "I")
_ROWS_PER_BLOCK = 512


class ImageRejected(StatusError):
    """An upload that is not an acceptable photo; `status` is the HTTP status to answer with."""


@dataclass(frozen=True)
class ImageInfo:
    format: str  # jpeg, png or webp
    width: int
    height: int

    @property
    def media_type(self) -> str:
        return FORMATS[self.format]


def sniff_format(data: bytes) -> str | None:
    """jpeg, png or webp from the file's first bytes (never from its name), else None."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


def _open(data: bytes, max_pixels: int) -> tuple[PilImage.Image, ImageInfo]:
    fmt = sniff_format(data)
    if fmt is None:
        raise ImageRejected(415, "unsupported image type: send a JPEG, PNG or WebP file")
    try:
        with warnings.catch_warnings():
            # The pixel limit is ours; PIL's own (warning, then error far above it) is only a backstop.
            warnings.simplefilter("ignore", PilImage.DecompressionBombWarning)
            image = PilImage.open(io.BytesIO(data), formats=list(_PIL_NAMES))
    except PilImage.DecompressionBombError:
        raise ImageRejected(413, f"image has too many pixels (limit {max_pixels})") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageRejected(400, f"cannot read the {fmt.upper()} header: {_short(exc)}") from None
    width, height = image.size
    if _PIL_NAMES.get(str(image.format)) != fmt:
        image.close()
        raise ImageRejected(400, f"file starts like {fmt.upper()} but does not parse as one")
    if width < 1 or height < 1:
        image.close()
        raise ImageRejected(400, f"image has an empty size {width}x{height}")
    if width * height > max_pixels:
        image.close()
        raise ImageRejected(
            413, f"image is {width}x{height} = {width * height} pixels; the limit is {max_pixels} pixels"
        )
    if max(width, height) > MAX_ASPECT * min(width, height):
        image.close()
        raise ImageRejected(
            422, f"image is {width}x{height}; its long side may be at most {MAX_ASPECT} times its short side"
        )
    return image, ImageInfo(fmt, width, height)


def inspect_image(data: bytes, max_pixels: int) -> ImageInfo:
    """Format and size from the header alone; `ImageRejected` for anything unacceptable."""
    image, info = _open(data, max_pixels)
    image.close()
    return info


class DecodeSlots:
    """How many photos may decode at once, process-wide: each decode holds up to ~4 bytes per pixel."""

    def __init__(self, count: int = 2) -> None:
        self._semaphore = threading.BoundedSemaphore(count)
        self.count = count

    def resize(self, count: int) -> None:
        if count < 1:
            raise ValueError("need at least one decode slot")
        self._semaphore = threading.BoundedSemaphore(count)
        self.count = count

    def __enter__(self) -> None:
        self._semaphore.acquire()

    def __exit__(self, *exc: object) -> None:
        self._semaphore.release()


decode_slots = DecodeSlots()


def decode_image(data: bytes, max_pixels: int, *, max_side: int = MAX_SIDE) -> tuple[Image, ImageInfo]:
    """The photo as BGR uint8, upright per its EXIF orientation, its long side at most `max_side`. The pixel
    count is checked from the header before decoding; truncated or corrupt data is refused."""
    image, info = _open(data, max_pixels)
    try:
        with decode_slots, warnings.catch_warnings():
            warnings.simplefilter("ignore", PilImage.DecompressionBombWarning)
            target = _fitted(image.size, max_side)
            if info.format == "jpeg":
                image.draft("RGB", target)  # decode at 1/2, 1/4 or 1/8 in the DCT while that still covers target
            image.load()
            small = _reduced(_opaque(image), target)
            upright = ImageOps.exif_transpose(small)
            rgb = upright.convert("RGB")
            pixels = np.asarray(rgb, dtype=np.uint8)
    except PilImage.DecompressionBombError:
        raise ImageRejected(413, f"image has too many pixels (limit {max_pixels})") from None
    except (OSError, ValueError, SyntaxError, EOFError, MemoryError) as exc:
        raise ImageRejected(400, f"corrupt or truncated {info.format.upper()} image: {_short(exc)}") from None
    finally:
        image.close()
    if pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ImageRejected(400, "image did not decode to colour pixels")
    bgr = np.ascontiguousarray(pixels[:, :, ::-1])
    height, width = bgr.shape[:2]
    return bgr, ImageInfo(info.format, width, height)


def encode_stored(image: Image) -> bytes:
    """The decoded pixels as PNG: what the store keeps instead of the upload (no metadata, no trailing bytes)."""
    ok, encoded = cv2.imencode(".png", np.ascontiguousarray(image), [cv2.IMWRITE_PNG_COMPRESSION, 3])
    if not ok:
        raise RuntimeError("PNG encoding failed")
    return encoded.tobytes()


def _fitted(size: tuple[int, int], max_side: int) -> tuple[int, int]:
    width, height = size
    scale = min(1.0, max_side / max(width, height))
    return max(1, round(width * scale)), max(1, round(height * scale))


def _eight_bit(image: PilImage.Image) -> PilImage.Image:
    """16-bit greyscale scaled to 8 bits (PIL's own conversion clips: most of a 16-bit photo becomes white)."""
    if image.mode not in _SIXTEEN_BIT:
        return image
    wide = np.asarray(image)
    out = np.empty(wide.shape, np.uint8)
    for top in range(0, wide.shape[0], _ROWS_PER_BLOCK):  # in blocks: a whole-image uint32 copy costs 4 B/px
        block = np.clip(wide[top : top + _ROWS_PER_BLOCK].astype(np.uint32), 0, 65535)
        out[top : top + _ROWS_PER_BLOCK] = (block * 255 + 32767) // 65535
    grey = PilImage.fromarray(out, "L")
    grey.info = dict(image.info)  # keeps the EXIF orientation
    return grey


def _opaque(image: PilImage.Image) -> PilImage.Image:
    """8-bit grey or RGB, dropping alpha as the conversion always did; the input is closed when replaced, so at most
    two full-size copies exist at once."""
    if image.mode in _SIXTEEN_BIT:
        converted = _eight_bit(image)
    elif image.mode not in ("RGB", "L"):
        converted = image.convert("RGB")
    else:
        return image
    image.close()
    return converted


def _reduced(image: PilImage.Image, target: tuple[int, int]) -> PilImage.Image:
    """`image` at `target` size; the full-size input is closed when a smaller copy replaces it."""
    if image.size == target:
        return image
    small = image.resize(target, PilImage.Resampling.LANCZOS, reducing_gap=2.0)
    image.close()
    return small


_OBJECT_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")


def _short(exc: BaseException) -> str:
    """The error's text without object reprs (they show heap addresses), cut to 200 characters."""
    text = _OBJECT_REPR.sub("", str(exc)).strip() or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
