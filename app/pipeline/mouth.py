"""Keep the target's own mouth: speech looks real only with the speaker's own lips, teeth and tongue.

`mouth_region` is 1 on the lips and inside them and fades toward the chin and cheeks; `MouthKeepingEngine`
wraps any swap engine and blends the target's mouth back into its output, with dense landmarks found on the
target crop. The mesh engine applies the same region itself, from the landmarks it already has. Both decide per
item (`SwapItem.keep_mouth`), so one shared engine serves streams with and without the mask; the server's setting
is only the default.
"""

from typing import Protocol, runtime_checkable

import cv2
import numpy as np
import numpy.typing as npt

from app.pipeline.landmarks import CropLandmarks, FaceMeshLandmarker, Mesh
from app.pipeline.stage import DEFAULT_SESSION
from app.pipeline.swap import PreparedSource, SwapEngine, SwapItem
from app.pipeline.types import Face, Image

# Outer lip contour, in order around the mouth (MediaPipe mesh indices).
OUTER_LIPS = (61, 146, 91, 181, 84, 17, 314, 405, 321, 375, 291, 409, 270, 269, 267, 0, 37, 39, 40, 185)
MOUTH_CORNERS = (61, 291)
FADE = 0.22  # sigma of the fade around the lips, as a fraction of the mouth's width
REACH_DOWN = 0.35  # the region also reaches this share of the mouth's width toward the chin
DEFAULT_AMOUNT = 1.0  # a stream's mask where the server's setting is 0 and the engine can keep the mouth (mesh)
UNAVAILABLE = (
    "the mouth mask is not available on this server: start it with SWAPCAST_MOUTH_MASK above 0 (e.g. 1), "
    "or with the mesh engine (SWAPCAST_ENGINE=mesh)"
)


@runtime_checkable
class KeepsMouth(Protocol):
    """An engine that can keep the target's mouth, item by item."""

    mouth_default: bool  # what items that do not say (`keep_mouth` None) get: the server's setting


def keeps_mouth(item: SwapItem, default: bool) -> bool:
    return default if item.keep_mouth is None else item.keep_mouth


def mouth_region(mesh: np.ndarray, shape: tuple[int, int]) -> npt.NDArray[np.float32]:
    """[H,W] float mask of the mouth of a mesh given in the mask's pixels."""
    xy = np.asarray(mesh, np.float64)[:, :2]
    width = float(np.linalg.norm(xy[MOUTH_CORNERS[0]] - xy[MOUTH_CORNERS[1]]))
    lips = xy[list(OUTER_LIPS)]
    # The region extends toward the chin: the lower lip moves the jaw's skin with it.
    down = xy[152] - xy[17]
    down = down / max(float(np.linalg.norm(down)), 1e-6) * width * REACH_DOWN
    lower = lips[lips[:, 1] >= xy[list(MOUTH_CORNERS), 1].mean()]
    mask = np.zeros(shape, np.float32)
    for polygon in (lips, np.vstack([lower, lower[::-1] + down])):
        cv2.fillPoly(mask, [np.round(polygon * 16).astype(np.int32)], 1.0, lineType=cv2.LINE_AA, shift=4)
    core = mask.copy()
    sigma = max(0.5, FADE * width)
    faded = np.clip(np.asarray(cv2.GaussianBlur(mask, (0, 0), sigmaX=sigma, sigmaY=sigma)) * 1.6, 0.0, 1.0)
    faded[faded < 0.01] = 0.0  # an invisible step, so the rest of the face is exactly the engine's
    return np.asarray(np.maximum(core, faded), np.float32)


class MouthKeepingEngine:
    """Any swap engine, with the target's mouth blended back in by `amount` (0..1) for the items that keep it."""

    def __init__(self, inner: SwapEngine, landmarker: FaceMeshLandmarker, amount: float) -> None:
        self.inner = inner
        self.landmarker = landmarker
        self.amount = float(np.clip(amount, 0.0, 1.0))
        self.mouth_default = self.amount > 0
        self.name = inner.name
        self.align = inner.align
        self.model_key = inner.model_key  # prepared identities stay valid: the source side is unchanged
        self._landmarks = CropLandmarks(landmarker, inner.align)

    def prepare(self, image: Image, face: Face) -> PreparedSource:
        return self.inner.prepare(image, face)

    def landmarks(self, crops: list[Image]) -> list[Mesh | None]:
        """Dense landmarks in each crop's pixels."""
        return self._landmarks.process(crops)

    def close(self) -> None:
        self.inner.close()
        self.landmarker.close()

    def process(self, batch: list[SwapItem], *, session: str = DEFAULT_SESSION) -> list[Image]:
        swapped = self.inner.process(batch, session=session)
        # Landmarks only for the items that keep their mouth: the others cost what the inner engine costs.
        kept = [i for i, item in enumerate(batch) if self.amount > 0 and keeps_mouth(item, self.mouth_default)]
        meshes = self.landmarks([batch[i].crop for i in kept]) if kept else []
        out = list(swapped)
        for i, mesh in zip(kept, meshes, strict=True):
            face, crop = swapped[i], batch[i].crop
            if mesh is None or face.shape != crop.shape:
                continue
            alpha = (mouth_region(mesh, face.shape[:2]) * self.amount)[..., None]
            blended = face + alpha * (crop.astype(np.float32) - face)
            out[i] = np.clip(blended + 0.5, 0, 255).astype(np.uint8)
        return out
