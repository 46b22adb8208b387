"""Colour statistics held steady per tracked face between frames.

The mesh engine matches the swapped face's colour to the target's every frame (app.pipeline.color). On a still
face the statistics still change a little from frame to frame (camera and codec noise, the mask moving by a
fraction of a pixel), and the 8-bit lookup table that applies them turns each such change into a one-level step
over whole bands of pixels: the pasted face shimmered. Held here, each statistic moves only by how far its
measured value is beyond `band` LAB units from what is applied (a real change of light is followed at once, less
the band; noise inside the band changes nothing).
"""

from dataclasses import dataclass, field

import numpy as np

Stats = tuple[np.ndarray, np.ndarray]  # per-channel LAB means and spreads

# LAB units: under one 8-bit code of a and b (1.0) and about one of L (0.39); the noise on a face's statistics is
# a tenth of that, a change of light tens of units.
DEFAULT_BAND = 0.5


@dataclass
class ColorHold:
    """One face's applied statistics: the swapped face's and the target's, as one vector of 12."""

    band: float = DEFAULT_BAND
    applied: np.ndarray | None = None

    def steady(self, face: Stats, target: Stats) -> tuple[Stats, Stats]:
        measured = np.concatenate([face[0], face[1], target[0], target[1]]).astype(np.float64)
        if self.applied is None or self.applied.shape != measured.shape:
            self.applied = measured
        else:
            gap = measured - self.applied
            self.applied = self.applied + np.sign(gap) * np.maximum(np.abs(gap) - self.band, 0.0)
        parts = np.split(self.applied.astype(np.float32), 4)
        return (parts[0], parts[1]), (parts[2], parts[3])


@dataclass
class ColorHolds:
    """One stream's holds, by track id."""

    band: float = DEFAULT_BAND
    holds: dict[int, ColorHold] = field(default_factory=dict)

    def get(self, track_id: int) -> ColorHold:
        if track_id not in self.holds:
            self.holds[track_id] = ColorHold(self.band)
        return self.holds[track_id]

    def forget_except(self, track_ids: set[int]) -> None:
        for track_id in [t for t in self.holds if t not in track_ids]:
            del self.holds[track_id]
