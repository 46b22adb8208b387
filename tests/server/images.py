"""Hostile and odd image files built in code."""

import struct
import zlib

import numpy as np


def png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_claiming(width: int, height: int) -> bytes:
    """A tiny PNG whose header claims `width` x `height` RGB pixels."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 64)
    return b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", header) + png_chunk(b"IDAT", idat) + png_chunk(b"IEND", b"")


def gif_bytes() -> bytes:
    """A 1x1 GIF."""
    return (
        b"GIF89a\x01\x00\x01\x00\x80\x00\x00\x00\x00\x00\xff\xff\xff!\xf9\x04\x01\x00\x00\x00\x00"
        b",\x00\x00\x00\x00\x01\x00\x01\x00\x00\x02\x02D\x01\x00;"
    )


def gradient(width: int = 320, height: int = 240) -> np.ndarray:
    """A picture with no face in it."""
    x = np.linspace(0, 255, width, dtype=np.float32)
    y = np.linspace(0, 255, height, dtype=np.float32)[:, None]
    image = np.stack(
        [np.broadcast_to(x, (height, width)), np.broadcast_to(y, (height, width)), np.full((height, width), 90)], axis=2
    )
    return np.ascontiguousarray(image.astype(np.uint8))
