"""Checks on uploaded identity photos: the format from magic bytes, the pixel count from the header before any
decoding, then a strict decode (truncated files are refused, not padded with grey)."""

import io
import warnings
from dataclasses import dataclass

import numpy as np
from PIL import Image as PilImage
from PIL import ImageOps, UnidentifiedImageError

from app.pipeline.types import Image

FORMATS = {"jpeg": "image/jpeg", "png": "image/png", "webp": "image/webp"}
_PIL_NAMES = {"JPEG": "jpeg", "PNG": "png", "WEBP": "webp"}


class ImageRejected(Exception):
    """An upload that is not an acceptable photo; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


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
    return image, ImageInfo(fmt, width, height)


def inspect_image(data: bytes, max_pixels: int) -> ImageInfo:
    """Format and size from the header alone; `ImageRejected` for anything unacceptable."""
    image, info = _open(data, max_pixels)
    image.close()
    return info


def decode_image(data: bytes, max_pixels: int) -> tuple[Image, ImageInfo]:
    """The photo as BGR uint8, upright per its EXIF orientation. The pixel count is checked from the header
    before decoding; truncated or corrupt data is refused."""
    image, info = _open(data, max_pixels)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PilImage.DecompressionBombWarning)
            image.load()
            upright = ImageOps.exif_transpose(image)
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


def _short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
