"""Dense face landmarks: MediaPipe's 468-point face mesh on face crops, and the canonical mesh it lives on.

The model sees a 192×192 RGB ROI in which the face (its landmarks' bounding box) fills two thirds of the side,
upright. Crops aligned by five points onto `mesh_template` (align's "face_mesh") are such ROIs: the template
is the canonical mesh's own frontal projection, framed the way MediaPipe frames its ROIs (landmark box × 1.5,
square). So a face crop from the detector's five points needs one model pass, and a face tracked from the
previous frame's landmarks needs one too (`five_points` gives those five points back). Crops aligned on any
other template reach the model through one fixed warp (`CropLandmarks`).
"""

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import cv2
import numpy as np
import numpy.typing as npt

from app.pipeline.align import TEMPLATES, AlignSpec
from app.pipeline.stage import DEFAULT_SESSION, ModelStage
from app.pipeline.types import Image, Points
from app.runtime.model import Model

INPUT_SIZE = 192
ROI_SCALE = 1.5  # MediaPipe's face ROI: the landmarks' bounding box, grown by half, made square

# Mesh vertices behind the detector's five points (ArcFace order: image-left eye, image-right eye, nose tip,
# image-left and image-right mouth corner). Eyes are the mean of their two corners.
EYE_LEFT = (33, 133)
EYE_RIGHT = (362, 263)
NOSE_TIP = 1
MOUTH_LEFT, MOUTH_RIGHT = 61, 291

Mesh = npt.NDArray[np.float32]  # [468, 3]: x, y in crop pixels, z relative depth (same scale as x)


@dataclass(frozen=True)
class FaceGeometry:
    """The canonical face mesh: 3D vertices (x right, y up), texture coordinates (v down), triangles."""

    canonical_xyz: npt.NDArray[np.float32]
    uv: npt.NDArray[np.float32]
    triangles: npt.NDArray[np.int32]


@lru_cache(maxsize=1)
def face_geometry() -> FaceGeometry:
    text = resources.files("app.pipeline").joinpath("data/face_mesh_geometry.json").read_text(encoding="utf-8")
    raw = json.loads(text)
    return FaceGeometry(
        np.asarray(raw["canonical_xyz"], np.float32),
        np.asarray(raw["uv"], np.float32),
        np.asarray(raw["triangles"], np.int32),
    )


# Two vertices per point (the nose tip and mouth corners twice), averaged in pairs: one gather for all five.
_FIVE_PAIRS = np.array([*EYE_LEFT, *EYE_RIGHT, NOSE_TIP, NOSE_TIP, MOUTH_LEFT, MOUTH_LEFT, MOUTH_RIGHT, MOUTH_RIGHT])


def five_points(mesh: np.ndarray) -> Points:
    """The detector's five points, in ArcFace order, taken from mesh landmarks."""
    xy = np.asarray(mesh, np.float32)[_FIVE_PAIRS, :2]
    return np.asarray((xy[0::2] + xy[1::2]) * np.float32(0.5), np.float32)


@lru_cache(maxsize=1)
def mesh_template() -> np.ndarray:
    """The five points of the canonical face, frontal, in a ROI framed as MediaPipe frames it (0..1)."""
    xyz = face_geometry().canonical_xyz
    xy = np.stack([xyz[:, 0], -xyz[:, 1]], axis=1)  # image axes: y grows downward
    low, high = xy.min(axis=0), xy.max(axis=0)
    side = float((high - low).max()) * ROI_SCALE
    corner = (low + high) / 2 - side / 2
    template = (five_points(np.hstack([xy, np.zeros((len(xy), 1))])) - corner) / side
    template.setflags(write=False)
    return template


class CropLandmarks:
    """Dense landmarks on crops aligned by any template: each crop is framed as the model wants (edges
    replicated where the crop is tighter than the model's ROI) and the points are mapped back to the crop."""

    def __init__(self, landmarker: "FaceMeshLandmarker", spec: AlignSpec) -> None:
        self.landmarker = landmarker
        source = TEMPLATES[spec.template] * spec.size
        target = TEMPLATES["face_mesh"] * INPUT_SIZE
        matrix, _ = cv2.estimateAffinePartial2D(source, target)
        self.to_roi = np.asarray(matrix, np.float64)
        self.from_roi = cv2.invertAffineTransform(self.to_roi)

    def process(self, crops: list[Image]) -> list[Mesh | None]:
        rois = [
            np.asarray(
                cv2.warpAffine(
                    crop, self.to_roi, (INPUT_SIZE, INPUT_SIZE), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE
                ),
                np.uint8,
            )
            for crop in crops
        ]
        out: list[Mesh | None] = []
        for mesh in self.landmarker.process(rois):
            if mesh is None:
                out.append(None)
                continue
            xy = mesh[:, :2] @ self.from_roi[:, :2].T + self.from_roi[:, 2]
            z = mesh[:, 2:] * float(np.sqrt(abs(np.linalg.det(self.from_roi[:, :2]))))
            out.append(np.hstack([xy, z]).astype(np.float32))
        return out


class FaceMeshLandmarker(ModelStage):
    """468 landmarks for each of a batch of crops aligned on `mesh_template` (any square size)."""

    name = "landmarks"

    def __init__(self, model: Model, min_score: float = 0.5) -> None:
        super().__init__(model)
        self.min_score = min_score

    def process(self, crops: list[Image], *, session: str = DEFAULT_SESSION) -> list[Mesh | None]:
        """Landmarks in each crop's pixels, or None where the model sees no face."""
        if not crops:
            return []
        rois = [
            crop
            if crop.shape[0] == INPUT_SIZE
            else np.asarray(cv2.resize(crop, (INPUT_SIZE, INPUT_SIZE), interpolation=cv2.INTER_AREA), np.uint8)
            for crop in crops
        ]
        # NCHW RGB 0..1 in one OpenCV call: a third of the time of numpy's flip, scale and transpose, same values.
        batch = np.asarray(cv2.dnn.blobFromImages(rois, 1.0 / 255.0, swapRB=True), np.float32)
        landmarks, scores = self.model.run({"image": batch})
        out: list[Mesh | None] = []
        for size, points, score in zip((crop.shape[0] for crop in crops), landmarks, scores, strict=True):
            if float(score[0]) < self.min_score:
                out.append(None)
                continue
            out.append((points * (size / INPUT_SIZE)).astype(np.float32))
        return out
