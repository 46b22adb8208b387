"""The spread-spectrum code shared by the embedder and the detector.

The mark is one tile of 32 x 32 chips, repeated over the whole frame. Every chip belongs to one of the 140 coded
bits (7 or 8 chips each, spread over the tile by a keyed permutation) and has a keyed pseudo-random sign; a chip's
value is its sign times its bit (+1 or -1). Chips are `CHIP_PX` pixels wide and smoothed with a Gaussian, so
the pattern is a field of soft blobs at 8-pixel periods: low enough to survive H.264 at CRF 28 and a halving
of the frame, high enough to stay separate from the picture after the detector's whitening.

Because the tile repeats, a crop only moves the tile's phase (the detector searches every phase) and a rescale
only changes its period (the detector tries a few scales)."""

from __future__ import annotations

import functools
import hashlib

import cv2
import numpy as np
import numpy.typing as npt

from app.provenance.fec import CODED_BITS
from app.provenance.payload import Bits

TILE_CHIPS = 32
CHIP_PX = 4
TILE_PX = TILE_CHIPS * CHIP_PX
BLUR_CHIPS = 0.375  # Gaussian sigma in chips (1.5 px at CHIP_PX 4)
SAMPLES_PER_CHIP = 2  # the detector's resolution: half-chip phases are found too
DETECT_TILE = TILE_CHIPS * SAMPLES_PER_CHIP

FloatArray = npt.NDArray[np.float64]


def _cyclic_blur(tile: FloatArray, sigma: float) -> FloatArray:
    """Gaussian blur of a periodic tile (wrapping at its edges, as it repeats in the frame)."""
    h, w = tile.shape
    wrapped = np.asarray(cv2.GaussianBlur(np.tile(tile, (3, 3)), (0, 0), sigma), np.float64)
    return wrapped[h : 2 * h, w : 2 * w]


class MarkCode:
    """Chip signs and the chip-to-bit map derived from a key; the same key embeds and detects."""

    def __init__(self, key: str) -> None:
        seed = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
        rng = np.random.default_rng(seed)
        self.signs: FloatArray = rng.choice(np.array([-1.0, 1.0]), size=(TILE_CHIPS, TILE_CHIPS))
        # Each coded bit owns 7 or 8 of the 1024 chips, scattered by the permutation.
        self.owner: npt.NDArray[np.int64] = (rng.permutation(TILE_CHIPS * TILE_CHIPS) % CODED_BITS).reshape(
            TILE_CHIPS, TILE_CHIPS
        )

    def tile(self, bits: Bits) -> FloatArray:
        """The embedded tile (TILE_PX square) for the 140 coded bits, scaled to unit RMS."""
        if bits.shape != (CODED_BITS,):
            raise ValueError(f"expected {CODED_BITS} bits, got shape {bits.shape}")
        chips = self.signs * np.where(bits[self.owner] > 0, 1.0, -1.0)
        pixels = np.asarray(np.kron(chips, np.ones((CHIP_PX, CHIP_PX))), np.float64)
        smooth = _cyclic_blur(pixels, BLUR_CHIPS * CHIP_PX)
        return smooth / float(np.sqrt(np.mean(smooth**2)))

    @functools.cached_property
    def templates_fft(self) -> npt.NDArray[np.complex128]:
        """Conjugate spectra of the 140 per-bit templates at the detector's resolution (DETECT_TILE square):
        template i is the tile with only bit i's chips, as the detector samples it."""
        templates = np.empty((CODED_BITS, DETECT_TILE, DETECT_TILE))
        block = np.ones((SAMPLES_PER_CHIP, SAMPLES_PER_CHIP))
        for bit in range(CODED_BITS):
            chips = np.where(self.owner == bit, self.signs, 0.0)
            templates[bit] = _cyclic_blur(np.asarray(np.kron(chips, block), np.float64), BLUR_CHIPS * SAMPLES_PER_CHIP)
        return np.conj(np.fft.fft2(templates))
