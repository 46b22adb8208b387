"""How open a face's eyes are, from MediaPipe's iris landmark model (engines.importers.iris_landmark): used at
identity upload to tell a source photo with closed eyes.

The 468-point face mesh places the lids loosely (shut eyes measure as open as open ones), so each eye is looked
at again by the iris model, which traces the lid margins on a close-up of the eye. Each eye's ROI is framed as
MediaPipe frames it: a square 2.3 times the larger of the corners' horizontal and vertical offsets, centred
between the corners, rotated upright, the image-right eye mirrored (the model knows one eye). Both eyes run as
one batch.
"""

import cv2
import numpy as np

from app.pipeline.landmarks import Mesh
from app.pipeline.types import Image
from app.runtime.model import Model
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore

MODEL_NAME = "iris_landmark"
INPUT_SIZE = 64
ROI_SCALE = 2.3
# Each eye's corners in the mesh, image-left one first (image-left eye: 33 outer, 133 inner; image-right eye: 362
# inner, 263 outer), and whether its ROI is mirrored.
EYES = ((33, 133, False), (362, 263, True))
LOWER_LID = slice(0, 9)  # eye_contour points: lower lid margin, corner to corner
UPPER_LID = slice(9, 16)  # upper lid margin between the corners, above LOWER_LID[1:8]


def eye_roi(corner_a: np.ndarray, corner_b: np.ndarray, mirror: bool) -> np.ndarray:
    """The 2x3 affine taking image pixels to the model's INPUT_SIZE ROI of the eye between two corners."""
    a, b = np.asarray(corner_a, np.float64), np.asarray(corner_b, np.float64)
    side = ROI_SCALE * float(np.abs(b - a).max())
    angle = float(np.arctan2(b[1] - a[1], b[0] - a[0]))
    cos, sin = np.cos(angle), np.sin(angle)
    linear = np.array([[cos, sin], [-sin, cos]]) * (INPUT_SIZE / max(side, 1e-6))
    if mirror:
        linear[0] *= -1
    centre = (a + b) / 2
    return np.hstack([linear, (INPUT_SIZE / 2 - linear @ centre)[:, None]])


def lid_gap(contour: np.ndarray) -> float:
    """Mean distance between the upper and lower lid margins, across the corner line, over the eye's width."""
    xy = np.asarray(contour, np.float64)[:, :2]
    lower, upper = xy[LOWER_LID], xy[UPPER_LID]
    across = lower[-1] - lower[0]
    width = max(float(np.linalg.norm(across)), 1e-6)
    normal = np.array([-across[1], across[0]]) / width  # points from the upper lid toward the lower one
    return float(np.mean((lower[1:-1] - upper) @ normal)) / width


class EyeOpenness:
    """Lid gap over eye width of the image-left and image-right eye of a face (0 = shut; open eyes measure
    about 0.14-0.30 on the sample photos)."""

    def __init__(self, model: Model) -> None:
        self.model = model

    def close(self) -> None:
        self.model.close()

    def measure(self, image: Image, mesh: Mesh) -> tuple[float, float]:
        """`mesh`: the face's 468 landmarks in `image`'s pixels."""
        xy = np.asarray(mesh, np.float64)[:, :2]
        batch = np.empty((len(EYES), INPUT_SIZE, INPUT_SIZE, 3), np.float32)
        for i, (a, b, mirror) in enumerate(EYES):
            roi = cv2.warpAffine(
                image,
                eye_roi(xy[a], xy[b], mirror),
                (INPUT_SIZE, INPUT_SIZE),
                flags=cv2.INTER_LINEAR,
                borderMode=cv2.BORDER_REPLICATE,
            )
            batch[i] = roi[..., ::-1]
        batch *= 1.0 / 255.0
        contours, _iris = self.model.run({"eye": np.ascontiguousarray(batch.transpose(0, 3, 1, 2))})
        left, right = (lid_gap(contour) for contour in contours)
        return left, right


def load_eye_openness(store: ModelStore, threads: int | None = None) -> EyeOpenness:
    """The iris model (imported from its package on first use). It runs at upload only, two 64x64 eyes a photo,
    so it always runs as the FP32 ONNX graph its threshold was measured with, never as a Triton, TensorRT or
    FP16 variant."""
    return EyeOpenness(OnnxModel(store.ensure(MODEL_NAME), threads=threads))
