"""Colour transfer in LAB by mean and standard deviation (Reinhard), weighted by a mask."""

import cv2
import numpy as np
import numpy.typing as npt

from app.pipeline.types import Image

FloatImage = npt.NDArray[np.float32]
STATS_SIZE = 64  # colour statistics of a larger image are taken on a thumbnail this size


def thumbnail_stats(image: Image) -> tuple[np.ndarray, np.ndarray]:
    """`lab_stats` of an image from its area-averaged thumbnail: means and spreads within a fraction of a LAB
    unit of the full image's on faces, for a tenth of the time at 256×256 (7.3 vs 0.7 ms)."""
    if max(image.shape[:2]) <= STATS_SIZE:
        return lab_stats(image)
    return lab_stats(np.asarray(cv2.resize(image, (STATS_SIZE, STATS_SIZE), interpolation=cv2.INTER_AREA), np.uint8))


def lab_stats(image: Image | FloatImage, weight: FloatImage | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std of an image in float LAB, optionally weighted by a [H,W] mask."""
    lab = cv2.cvtColor(np.asarray(image, np.float32) / 255.0, cv2.COLOR_BGR2LAB).reshape(-1, 3)
    if weight is None:
        return lab.mean(axis=0), lab.std(axis=0)
    w = weight.reshape(-1, 1).astype(np.float32)
    total = float(w.sum())
    if total < 1e-6:
        return lab.mean(axis=0), lab.std(axis=0)
    mean = (lab * w).sum(axis=0) / total
    std = np.sqrt(((lab - mean) ** 2 * w).sum(axis=0) / total)
    return mean, std


def transfer_color(
    image: Image | FloatImage,
    source_stats: tuple[np.ndarray, np.ndarray],
    target_stats: tuple[np.ndarray, np.ndarray],
    strength: float = 1.0,
) -> FloatImage:
    """Move `image` (whose stats are `source_stats`) toward `target_stats`; returns float32 BGR 0..255."""
    pixels = np.asarray(image, np.float32)
    if strength <= 0:
        return pixels
    (src_mean, src_std), (dst_mean, dst_std) = source_stats, target_stats
    gain = np.where(src_std > 1e-3, dst_std / np.maximum(src_std, 1e-3), 1.0).astype(np.float32)
    lab = cv2.cvtColor(pixels / 255.0, cv2.COLOR_BGR2LAB)
    moved = (lab - src_mean) * gain + dst_mean
    if strength < 1:
        moved = lab + strength * (moved - lab)
    moved[..., 0] = np.clip(moved[..., 0], 0, 100)
    out = cv2.cvtColor(moved.astype(np.float32), cv2.COLOR_LAB2BGR) * 255.0
    return np.clip(out, 0, 255)
