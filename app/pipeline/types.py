"""Data passed between pipeline stages. Images are BGR uint8 HxWx3 numpy arrays throughout."""

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt

Image = npt.NDArray[np.uint8]
Matrix = npt.NDArray[np.float64]  # 2x3 affine, frame -> crop
Points = npt.NDArray[np.float32]  # 5x2 landmarks: eyes, nose, mouth corners (ArcFace order)
# seen: found by the latest detection round; predicted: missed briefly, swapped where the tracker expects it;
# lost: missed for longer, covered where it was last seen (app.pipeline.track)
FaceStatus = Literal["seen", "predicted", "lost"]


@dataclass(frozen=True)
class Face:
    """One detected (or tracked) face in frame coordinates."""

    box: npt.NDArray[np.float32]  # x1, y1, x2, y2
    score: float
    landmarks: Points
    track_id: int = -1
    status: FaceStatus = "seen"

    @property
    def area(self) -> float:
        return float(max(0.0, self.box[2] - self.box[0]) * max(0.0, self.box[3] - self.box[1]))


@dataclass
class AlignedFace:
    """A face warped onto a template; `matrix` maps frame coordinates to crop coordinates."""

    frame_index: int
    face: Face
    crop: Image
    matrix: Matrix


@dataclass
class FrameResult:
    """A processed frame and the faces that were swapped in it."""

    image: Image
    faces: list[Face] = field(default_factory=list)
