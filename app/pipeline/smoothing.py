"""One-Euro smoothing of a face's landmarks between frames (Casiez, Roussel and Vogel, CHI 2012).

A low-pass filter whose cutoff rises with the speed of the face: a still face's points are smoothed hard (the
landmark model's jitter goes), a moving face's hardly at all (no lag). Written here rather than taken from the
`oneeurofilter` package: that one filters one number per call, and a face's 468 points are filtered as one
array per frame, with one speed per face (its points' mean motion, in eye distances), so all points of a face
share a cutoff and the face moves as one.

Time is counted in frames, so the cutoffs are in cycles per frame times the stream's nominal rate (`rate`).

After the filter, a dead band: on a still face the filter still lets about half of the model's jitter through
(the jitter itself reads as a little speed), and each sub-pixel move reshapes the warp, the mask's edge and the
crop's sampling. So each shown point stays put until the filtered one is `dead_band` eye distances away, then
follows by the excess (no jumps); the band closes as the face speeds up, so a moving face is not shown behind.
On a near-still H.264 clip this took the swapped face's flicker ratio from 1.16 to 0.81 (docs/guides/occlusion.md).
"""

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Points = npt.NDArray[np.float32]


@dataclass(frozen=True)
class SmoothingConfig:
    min_cutoff: float = 2.0  # Hz: the cutoff of a still face (lower: smoother, slower)
    beta: float = 20.0  # Hz per (eye distance per second): how fast the cutoff rises with speed
    speed_cutoff: float = 1.0  # Hz: the cutoff of the speed estimate itself
    rate: float = 30.0  # frames per second the cutoffs are given for
    # Eye distances each filtered point may wander from where it is shown before the shown point follows (by the
    # excess only, so it never jumps): the filter's own residue of the model's jitter stays under it. 0: off.
    dead_band: float = 0.005
    # Eye distances per second at which the band has closed (linearly from a still face's): a moving face is
    # shown where the filter has it, not a band behind.
    band_release: float = 0.25


def _alpha(cutoff: float, rate: float) -> float:
    tau = 1.0 / (2.0 * math.pi * cutoff)
    return 1.0 / (1.0 + tau * rate)


@dataclass
class _State:
    points: npt.NDArray[np.float64]
    shown: npt.NDArray[np.float64]
    speed: float = 0.0


def follow_outside(shown: npt.NDArray[np.float64], points: npt.NDArray[np.float64], band: float) -> None:
    """Move each `shown` point (in place) toward its `points` one by how far it is beyond `band` (in x and y, z
    carried along): a point held within the band, dragged along at the band's edge beyond it."""
    gap = points - shown
    distance = np.sqrt(gap[:, 0] ** 2 + gap[:, 1] ** 2)
    share = np.maximum(0.0, 1.0 - band / np.maximum(distance, 1e-12))
    shown += share[:, None] * gap


@dataclass
class LandmarkSmoother:
    """One stream's filters, per tracked face."""

    config: SmoothingConfig = field(default_factory=SmoothingConfig)
    states: dict[int, _State] = field(default_factory=dict)

    def smooth(self, track_id: int, points: Points, scale: float) -> Points:
        """`points` [N,2+] of face `track_id` in this frame, filtered; `scale`: the face's eye distance (px)."""
        raw = np.asarray(points, np.float64)
        state = self.states.get(track_id)
        if state is None or state.points.shape != raw.shape:
            self.states[track_id] = _State(raw.copy(), raw.copy())
            return points
        config = self.config
        step = float(np.linalg.norm((raw[:, :2] - state.points[:, :2]).mean(axis=0))) / max(scale, 1.0)
        speed = step * config.rate
        state.speed += _alpha(config.speed_cutoff, config.rate) * (speed - state.speed)
        alpha = _alpha(config.min_cutoff + config.beta * state.speed, config.rate)
        state.points += alpha * (raw - state.points)
        if config.dead_band <= 0:
            return state.points.astype(np.float32)
        band = config.dead_band * max(0.0, 1.0 - state.speed / max(config.band_release, 1e-9))
        follow_outside(state.shown, state.points, band * max(scale, 1.0))
        return state.shown.astype(np.float32)

    def forget_except(self, track_ids: set[int]) -> None:
        for track_id in [t for t in self.states if t not in track_ids]:
            del self.states[track_id]
