"""Finding the mark: whiten each frame, fold it onto one tile, add frames up, correlate with every bit's
template at every phase, and test the result against what unmarked video gives.

Per frame and per candidate scale the luma is resampled to two samples per chip, its local mean removed (the
picture is mostly low-frequency; the mark is not), every sample divided by the local variance of that residual
(the weighting a matched filter gives samples whose noise differs: where texture or edges dominate, the picture
drowns the mark and counts little; where the picture is smooth, the mark shows and counts much), and the whole
frame summed onto one DETECT_TILE square tile: every copy of the repeated mark adds up in phase, the picture
does not. Tiles of the frames in a window (one second) are summed too.

The decision. For coded bit i and phase s, z_i(s) is the correlation of the folded tile (its spectrum flattened
to phase only) with bit i's template, divided by a robust spread of that correlation over all phases (the phases
that are not the mark's are a sample of what chance gives). Bits own disjoint chips, so without a mark the z_i
are independent and near standard normal, and S(s) = sum_i z_i(s)^2 follows a chi-square law with 140 degrees
of freedom (`swapcast bench-watermark` checks this on unmarked video). The detector takes the phase and scale
with the largest S, decodes the 140 scores there (soft Viterbi) and calls the window marked when the CRC-16 of
the decoded payload passes and phases x scales x P(chi2_140 > S) x 2^-16 is at most FALSE_POSITIVE_PER_WINDOW.
The last factor is the CRC's: one decode per window, and without a mark a decoded word is as good as random,
so it passes the CRC once in 65536."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import cv2
import numpy as np
import numpy.typing as npt

from app.pipeline.types import Image
from app.provenance.code import CHIP_PX, DETECT_TILE, SAMPLES_PER_CHIP, MarkCode
from app.provenance.fec import CODED_BITS, decode
from app.provenance.payload import CRC_BITS, Payload
from app.provenance.stats import chi2_isf, chi2_log_sf

# How the video was rescaled relative to what was marked: unchanged, 1080p->720p-like, 720p->480p, half.
DEFAULT_SCALES: tuple[float, ...] = (1.0, 0.75, 2.0 / 3.0, 0.5)
FALSE_POSITIVE_PER_WINDOW = 1e-6
WHITEN_BOX = 5  # samples (2.5 chips): wide enough to keep the mark's blobs, narrow enough to drop the picture
# The local variance that weights each residual sample: its window (samples) and a floor (grey levels squared)
# that keeps flat, codec-smoothed areas from taking over. Measured on the bench's clips against the earlier
# global 3-sigma clip: the busiest photo's weakest second rose from S 248 to 527 through H.264 CRF 28 and from
# 238 to 415 at half size (threshold 228), unmarked windows stayed at 205-216, and dropping the clip's median
# halved the cost per frame. Weighting by 1/sigma instead of 1/sigma^2, or weighting whole frames, did worse.
WEIGHT_BOX = 7
WEIGHT_FLOOR = 1.0

FloatArray = npt.NDArray[np.float64]


@dataclass
class Detection:
    found: bool
    payload: Payload | None  # the payload read at the best phase when its CRC matched
    statistic: float  # S at the best phase and scale
    false_positive_p: float  # chance that a window of unmarked video gives S this high and a passing CRC
    scale: float
    phase: tuple[int, int]  # (dy, dx) in detector samples
    frames: int
    threshold: float  # the statistic a window needs to be called marked
    bit_z: list[float] = field(default_factory=list)  # signed scores of the 140 coded bits at the best phase
    bits: list[int] = field(default_factory=list)  # the 64 payload bits decoded there (CRC not checked)

    @property
    def confidence(self) -> float:
        """-log10 of the false-positive probability (6 = one in a million), capped at 300."""
        return min(300.0, -math.log10(max(self.false_positive_p, 1e-300)))


def statistic_threshold(tests: int, rate: float = FALSE_POSITIVE_PER_WINDOW) -> float:
    """S above which a window with a passing CRC is called marked, for `tests` phase-and-scale candidates."""
    return chi2_isf(min(0.5, rate * 2**CRC_BITS / tests), CODED_BITS)


def to_luma(image: Image) -> npt.NDArray[np.float32]:
    return np.asarray(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), np.float32)


def fold(luma: npt.NDArray[np.float32], scale: float) -> FloatArray:
    """One frame's luma, whitened and folded onto the detector's tile for the candidate `scale`."""
    factor = SAMPLES_PER_CHIP / (CHIP_PX * scale)
    if abs(factor - 1.0) > 1e-6:
        interp = cv2.INTER_AREA if factor < 1 else cv2.INTER_LINEAR
        luma = np.asarray(cv2.resize(luma, None, fx=factor, fy=factor, interpolation=interp), np.float32)
    white = luma - np.asarray(cv2.blur(luma, (WHITEN_BOX, WHITEN_BOX)), np.float32)
    local_var = np.asarray(cv2.blur(white * white, (WEIGHT_BOX, WEIGHT_BOX)), np.float32)
    white /= local_var + WEIGHT_FLOOR
    h, w = white.shape
    padded = np.zeros((-(-h // DETECT_TILE) * DETECT_TILE, -(-w // DETECT_TILE) * DETECT_TILE), np.float64)
    padded[:h, :w] = white
    ph, pw = padded.shape
    return padded.reshape(ph // DETECT_TILE, DETECT_TILE, pw // DETECT_TILE, DETECT_TILE).sum(axis=(0, 2))


class WatermarkDetector:
    """Accumulates frames of one window and decides whether they carry a mark."""

    def __init__(self, code: MarkCode, scales: Sequence[float] = DEFAULT_SCALES) -> None:
        if not scales or any(s <= 0 for s in scales):
            raise ValueError("scales must be positive")
        self._code = code
        self.scales = tuple(scales)
        self.tests = len(self.scales) * DETECT_TILE * DETECT_TILE
        self.threshold = statistic_threshold(self.tests)
        self.reset()

    def reset(self) -> None:
        self.frames = 0
        self._tiles = [np.zeros((DETECT_TILE, DETECT_TILE)) for _ in self.scales]

    def add(self, image: Image) -> None:
        """Add a BGR frame to the window."""
        self.add_luma(to_luma(image))

    def add_luma(self, luma: npt.NDArray[np.float32]) -> None:
        self.add_folded(self.fold_all(luma))

    def fold_all(self, luma: npt.NDArray[np.float32]) -> list[FloatArray]:
        """One frame folded at every candidate scale (what `add_folded` takes)."""
        return [fold(luma, scale) for scale in self.scales]

    def add_folded(self, tiles: Sequence[FloatArray]) -> None:
        for total, tile in zip(self._tiles, tiles, strict=True):
            total += tile
        self.frames += 1

    def scores(self, tile: FloatArray) -> FloatArray:
        """z_i(s) for every coded bit i and phase s: shape (140, DETECT_TILE, DETECT_TILE)."""
        spectrum = np.fft.fft2(tile)
        # Phase only: every frequency of the folded tile gets the same weight, so what piles up at a few
        # frequencies (codec block grids, JPEG blocks in the source, repeated texture) cannot pass for a mark.
        # Measured on a 720p group photo through H.264: without it the statistic of unmarked video had a median of
        # 182 instead of chi-square's 63.3; with it 63.7, and the mark's statistic rose by 10-40 %.
        spectrum /= np.abs(spectrum) + 1e-9
        corr = np.real(np.fft.ifft2(spectrum[None] * self._code.templates_fft))
        flat = corr.reshape(CODED_BITS, -1)
        spread = 1.4826 * np.median(np.abs(flat - np.median(flat, axis=1, keepdims=True)), axis=1) + 1e-12
        return np.asarray(corr / spread[:, None, None], np.float64)

    def result(self) -> Detection:
        """The decision for the frames added since the last reset."""
        best: tuple[float, int, tuple[int, int], FloatArray] | None = None
        for index, tile in enumerate(self._tiles):
            z = self.scores(tile)
            stat = (z**2).sum(axis=0)
            dy, dx = np.unravel_index(int(np.argmax(stat)), stat.shape)
            value = float(stat[dy, dx])
            if best is None or value > best[0]:
                best = (value, index, (int(dy), int(dx)), z[:, dy, dx])
        assert best is not None
        stat, index, phase, bit_z = best
        tail = math.exp(chi2_log_sf(stat, CODED_BITS)) if self.frames else 1.0
        p = min(1.0, self.tests * tail) * 2.0**-CRC_BITS
        bits = decode(bit_z) if self.frames else np.zeros(0, np.uint8)
        payload = Payload.from_bits(bits) if self.frames else None
        found = payload is not None and p <= FALSE_POSITIVE_PER_WINDOW
        return Detection(
            found=found,
            payload=payload if found else None,
            statistic=stat,
            false_positive_p=p,
            scale=self.scales[index],
            phase=phase,
            frames=self.frames,
            threshold=self.threshold,
            bit_z=[float(v) for v in bit_z],
            bits=[int(b) for b in bits],
        )


def detect_windows(
    frames: Iterable[Image], code: MarkCode, *, window: int, scales: Sequence[float] = DEFAULT_SCALES
) -> list[Detection]:
    """One decision per `window` frames (the last, shorter window too when it has at least half a window)."""
    if window < 1:
        raise ValueError("window must be at least 1 frame")
    detector = WatermarkDetector(code, scales)
    results: list[Detection] = []
    for image in frames:
        detector.add(image)
        if detector.frames == window:
            results.append(detector.result())
            detector.reset()
    if detector.frames and (detector.frames * 2 >= window or not results):
        results.append(detector.result())
    return results


def best_of(detections: Sequence[Detection]) -> Detection | None:
    """The found window with the lowest false-positive probability, else the closest miss."""
    if not detections:
        return None
    found = [d for d in detections if d.found]
    pool = found or list(detections)
    return min(pool, key=lambda d: (d.false_positive_p, -d.statistic))
