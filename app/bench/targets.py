"""The quality targets `swapcast bench-quality` judges its measurements against, one per row.

A row is one measured figure of one engine (a share, a pixel error, a cost); its target is a bound from the
issue that set it. Rows with no agreed target (jitter) are reported with `target` and `met` left empty, so a
reader sees the figure without a verdict nobody asked for.
"""

from dataclasses import dataclass
from typing import Any, Literal

Op = Literal[">=", "<="]


@dataclass(frozen=True)
class Target:
    op: Op
    bound: float

    def met(self, value: float) -> bool:
        return value >= self.bound if self.op == ">=" else value <= self.bound

    def __str__(self) -> str:
        return f"{self.op} {self.bound:g}"


@dataclass(frozen=True)
class RowSpec:
    section: str
    key: str  # the figure's key in the section's measurement
    label: str
    target: Target | None
    engines: tuple[str, ...] | None = None  # the target holds for these engines only; None: all of them


# Likeness targets are the mesh engine's; the others' figures are shown for comparison.
LIKENESS = (
    RowSpec("likeness", "closer_to_source", "closer to source (share)", Target(">=", 0.95), ("mesh",)),
    RowSpec("likeness", "landmark_error", "landmark error", Target("<=", 0.06), ("mesh",)),
)
OCCLUSION = (
    RowSpec("occlusion", "hand_kept", "hand kept, mean", Target(">=", 0.90)),
    RowSpec("occlusion", "hand_kept_min", "hand kept, worst frame", Target(">=", 0.90)),
    RowSpec("occlusion", "iou", "IoU with the true hand", Target(">=", 0.80)),
    RowSpec("occlusion", "face_swapped", "face outside the hand swapped", Target(">=", 0.90)),
    RowSpec("occlusion", "ms_per_face", "cost ms/face, hand crossing (mean)", Target("<=", 6.0)),
    RowSpec("occlusion", "ms_per_face_no_hand", "cost ms/face, no hand (mean)", Target("<=", 6.0)),
    # The same costs in CPU time of the calling thread (the stage's own work with --threads 1): the wall-clock
    # rows above also count the wait for a core on a machine busy with other work.
    RowSpec("occlusion", "cpu_ms_per_face", "cost CPU ms/face, hand crossing (mean)", Target("<=", 6.0)),
    RowSpec("occlusion", "cpu_ms_per_face_no_hand", "cost CPU ms/face, no hand (mean)", Target("<=", 6.0)),
)
FLICKER = (
    RowSpec("flicker", "still_flicker_ratio", "flicker ratio, still clip", Target("<=", 1.2)),
    RowSpec("flicker", "near_still_flicker_ratio", "flicker ratio, near-still H.264 clip", Target("<=", 1.2)),
    RowSpec("flicker", "still_jitter_px", "jitter px, still clip", None),
    RowSpec("flicker", "slow_jitter_px", "jitter px, slow clip", None),
    RowSpec("flicker", "fast_lag_frames", "lag frames, fast clip", Target("<=", 1.0)),
)
SPECS = {"likeness": LIKENESS, "occlusion": OCCLUSION, "flicker": FLICKER}


def judge(spec: RowSpec, engine: str, value: float) -> dict[str, Any]:
    """One report row: the measured value, its target where one holds for `engine`, and whether it is met."""
    target = spec.target if spec.engines is None or engine in spec.engines else None
    return {
        "section": spec.section,
        "engine": engine,
        "row": spec.label,
        "key": spec.key,
        "value": value,
        "target": str(target) if target else None,
        "met": target.met(value) if target else None,
    }


def rows(section: str, engine: str, figures: dict[str, float]) -> list[dict[str, Any]]:
    """The section's rows for one engine, from its flat figures (keys as in `SPECS`)."""
    return [judge(spec, engine, float(figures[spec.key])) for spec in SPECS[section]]
