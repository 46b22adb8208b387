"""The `mesh` swap engine: no trained swap network. The source face's texture is warped onto the target's
468-point face mesh, so the target's expression and head pose are followed, while the target keeps its own
mouth interior and eye openings.

Per face: dense landmarks on the target crop (one model pass: a fixed warp frames the crop as the landmark
model wants), the piecewise-affine maps on a small grid (app.pipeline.mesh_warp), one remap of the source
texture, colour matched to the target in LAB on thumbnails (the statistics held steady per tracked face:
app.pipeline.color_hold), and a blend through a mask defined in canonical
texture space (brows to chin, inside the cheek silhouette) minus the target's mouth and eye openings.
Measured by `swapcast bench-quality`; prototype figures are in docs/guides/files.md (Engines).
"""

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import cv2
import numpy as np
import numpy.typing as npt

from app.errors import UserError
from app.pipeline.align import AlignSpec, estimate_matrix, similarity_fit, transform_points, warp_crop
from app.pipeline.color import STATS_SIZE, lab_stats, transfer_color_u8
from app.pipeline.color_hold import ColorHold
from app.pipeline.landmarks import CropLandmarks, FaceMeshLandmarker, Mesh, five_points
from app.pipeline.mesh_track import MeshTracking
from app.pipeline.mesh_warp import (
    FACE_OVAL,
    LEFT_EYE_OPENING,
    MOUTH_OPENING,
    RIGHT_EYE_OPENING,
    hole_mask,
    mesh_maps,
    sample_uv_mask,
    upsample_box,
    uv_mask,
)
from app.pipeline.mouth import DEFAULT_AMOUNT, OUTER_LIPS, keeps_mouth, mouth_region
from app.pipeline.stage import DEFAULT_SESSION
from app.pipeline.swap import PreparedSource, SwapItem, check_sources
from app.pipeline.timing import StageTimer
from app.pipeline.types import Face, Image

GAIN_LIMITS = (0.67, 1.5)
CROP_FRAMING = 1.2  # the crop's side over the face's landmark box (the face_mesh_tight template)


@dataclass(frozen=True)
class MeshConfig:
    size: int = 288  # crop side: the face (its landmark box) spans 1/1.2 of it, 240 px
    grid_face: int = 160  # geometry is computed with the face at most this many pixels wide, maps upsampled
    hole_feather: float = 0.006  # sigma of the mouth/eye hole edges, as a fraction of the crop
    keep_eyes: float = 1.0  # show the target's own eyes (gaze, blinks) inside the lids: 0 the source's .. 1
    mouth_mask: float = 0.0  # keep the target's own lips too (app.pipeline.mouth): 0 off .. 1; items may override
    shape: float = 0.0  # pull the inner face toward the source's proportions (lips, lids, outline stay): 0 .. 1
    color_strength: float = 1.0


def source_record_dtype(size: int) -> np.dtype:
    """A prepared source: the aligned texture and its landmarks, one record (stored as one .npy)."""
    return np.dtype([("texture", np.uint8, (size, size, 3)), ("mesh", np.float32, (468, 3))])


class MeshEngine:
    """Weightless swap that follows expression and pose. See the module docstring."""

    name = "mesh"

    def __init__(self, landmarker: FaceMeshLandmarker, config: MeshConfig | None = None) -> None:
        self.landmarker = landmarker
        self.config = config or MeshConfig()
        self.align = AlignSpec("face_mesh_tight", self.config.size)
        self.model_key = f"mesh:{self.config.size}"
        self.crop_landmarks = CropLandmarks(landmarker, self.align)
        # geometry on a grid where the face is at most grid_face pixels; `scale` crop pixels per grid pixel
        factor = max(1, int(np.ceil(self.config.size / CROP_FRAMING / self.config.grid_face)))
        self.grid = int(np.ceil(self.config.size / factor))
        self.scale = self.config.size / self.grid
        # The lips are kept per item (`SwapItem.keep_mouth`); the configured amount is only the default.
        self.mouth_default = self.config.mouth_mask > 0
        self.mouth_amount = self.config.mouth_mask if self.mouth_default else DEFAULT_AMOUNT

    def prepare(self, image: Image, face: Face) -> PreparedSource:
        """The source texture, framed by a second landmark pass (the detector's five points frame it roughly)."""
        spec = self.align
        matrix = estimate_matrix(face.landmarks, spec)
        crop = warp_crop(image, matrix, spec.size)
        (mesh,) = self.crop_landmarks.process([crop])
        if mesh is not None:
            refined = transform_points(five_points(mesh), cv2.invertAffineTransform(matrix)).astype(np.float32)
            crop = warp_crop(image, estimate_matrix(refined, spec), spec.size)
            (again,) = self.crop_landmarks.process([crop])
            mesh = again if again is not None else None
        if mesh is None:
            raise UserError("the face landmark model finds no face in this photo: use a sharper, more frontal one")
        record = np.zeros(1, source_record_dtype(spec.size))
        record["texture"][0] = crop
        record["mesh"][0] = mesh
        return PreparedSource(self.name, self.model_key, record)

    def close(self) -> None:
        self.landmarker.close()

    def new_landmark_tracking(self) -> MeshTracking:
        """Per-stream state that follows each face's landmarks from frame to frame (app.pipeline.mesh_track)."""
        return MeshTracking(self.landmarker)

    def process(self, batch: list[SwapItem], *, session: str = DEFAULT_SESSION) -> list[Image]:
        check_sources(self, batch)
        # Landmarks tracked by the caller (app.pipeline.mesh_track) are used as given; the rest are found here.
        untracked = [i for i, item in enumerate(batch) if item.mesh is None]
        found = dict(zip(untracked, self.crop_landmarks.process([batch[i].crop for i in untracked]), strict=True))
        meshes = [found[i] if item.mesh is None else item.mesh for i, item in enumerate(batch)]
        return [
            item.crop.copy()
            if mesh is None
            else self.swap_one(
                item.crop, item.source.data, mesh, keep_mouth=keeps_mouth(item, self.mouth_default), color=item.color
            )
            for item, mesh in zip(batch, meshes, strict=True)
        ]

    def swap_one(
        self,
        target: Image,
        record: npt.NDArray[np.void],
        target_mesh: Mesh,
        timer: StageTimer | None = None,
        *,
        keep_mouth: bool | None = None,
        color: ColorHold | None = None,
    ) -> Image:
        """`timer` (benchmarks): time each step as its own stage. `keep_mouth`: the target's lips too (None: the
        configured default). `color`: the face's colour statistics held from its previous frames (None: afresh)."""

        def step(name: str) -> AbstractContextManager[None]:
            return timer.stage(f"mesh_{name}") if timer is not None else nullcontext()

        size, grid, scale = self.config.size, self.grid, self.scale
        texture = record["texture"][0]
        source_mesh = record["mesh"][0]
        with step("maps"):
            geometry = shaped(target_mesh, source_mesh, self.config.shape) if self.config.shape > 0 else target_mesh
            maps = mesh_maps(geometry, source_mesh, grid, scale)
        with step("mask"):
            mask = sample_uv_mask(maps, uv_mask())
            mask *= 1.0 - self._holes(target_mesh)
            if self.mouth_default if keep_mouth is None else keep_mouth:
                on_grid = (target_mesh[:, :2] + 0.5) / scale - 0.5
                mask *= 1.0 - self.mouth_amount * mouth_region(on_grid, mask.shape[:2])
            # The mask and both source coordinates upsampled only over the mask's box: nothing outside it is
            # blended (app.pipeline.mesh_warp.upsample_box).
            boxed = upsample_box(mask, (maps.source_x, maps.source_y), size)
        if boxed is None:
            return target.copy()
        box, alpha, (source_x, source_y) = boxed
        with step("remap"):
            warped = cv2.remap(texture, source_x, source_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE)
        with step("colour_blend"):
            return self._blend(target, np.asarray(warped, np.uint8), alpha, box, color)

    def _holes(self, mesh: Mesh) -> npt.NDArray[np.float32]:
        """Where the target shows through: its mouth opening, and its eye openings by `keep_eyes`."""
        mouth = hole_mask(mesh, (MOUTH_OPENING,), self.grid, self.scale)
        # grow the mouth a little before feathering, so the blend's ramp lies on the lips, not in the mouth
        mask = np.asarray(cv2.dilate(mouth, np.ones((3, 3), np.uint8)), np.float32)
        if self.config.keep_eyes > 0:
            eyes = hole_mask(mesh, (LEFT_EYE_OPENING, RIGHT_EYE_OPENING), self.grid, self.scale)
            mask = np.maximum(mask, eyes * self.config.keep_eyes)
        sigma = max(0.5, self.config.hole_feather * self.config.size / self.scale)
        return np.asarray(cv2.GaussianBlur(mask, (0, 0), sigmaX=sigma, sigmaY=sigma), np.float32)

    def _blend(
        self,
        target: Image,
        face: Image,
        alpha: npt.NDArray[np.float32],
        box: tuple[int, int, int, int],
        color: ColorHold | None = None,
    ) -> Image:
        """Colour-match the warped `face` (the mask's `box` of the crop) to `target` under the mask `alpha`, then
        blend it into the box; `color` holds the statistics steady from frame to frame."""
        y0, y1, x0, x1 = box
        under = np.ascontiguousarray(target[y0:y1, x0:x1])
        if self.config.color_strength > 0:
            small_alpha = np.asarray(_thumbnail(alpha), np.float32)
            face_stats = lab_stats(np.asarray(_thumbnail(face), np.uint8), small_alpha)
            target_stats = lab_stats(np.asarray(_thumbnail(under), np.uint8), small_alpha)
            # Spreads are matched within limits: a fully stretched chroma spread turned pale skin blotchy on
            # the sample photos.
            low, high = face_stats[1] * GAIN_LIMITS[0], face_stats[1] * GAIN_LIMITS[1]
            spread = np.minimum(np.maximum(target_stats[1], low), high)
            target_stats = (target_stats[0], spread)
            if color is not None:
                face_stats, target_stats = color.steady(face_stats, target_stats)
            # In 8-bit LAB through a lookup table: a quarter of the float conversion's time, a fifth of a grey
            # level from it on average (3 at the 99.9th percentile) on the sample faces.
            face = transfer_color_u8(face, face_stats, target_stats, self.config.color_strength)
        out = target.copy()
        # Blended in uint8 by OpenCV: a third of float numpy's time, within one grey level of it.
        out[y0:y1, x0:x1] = cv2.blendLinear(face, under, alpha, 1.0 - alpha)
        return out


_KEPT_IN_PLACE = np.array(
    sorted({*FACE_OVAL, *OUTER_LIPS, *MOUTH_OPENING, *LEFT_EYE_OPENING, *RIGHT_EYE_OPENING}), np.int64
)


def shaped(target_mesh: np.ndarray, source_mesh: np.ndarray, amount: float) -> np.ndarray:
    """The target mesh with its inner vertices moved `amount` of the way to the source's, the source mesh laid
    onto the target by a similarity fit; the outline, lips and eyelids stay where the target has them, so
    expression and the blend's edge are unchanged."""
    target_xy = np.asarray(target_mesh, np.float64)[:, :2]
    source_xy = np.asarray(source_mesh, np.float64)[:, :2]
    laid = transform_points(source_xy, similarity_fit(source_xy, target_xy))  # least squares (Umeyama)
    moved = np.array(target_mesh, np.float32, copy=True)
    weight = np.full(len(moved), float(np.clip(amount, 0.0, 1.0)))
    weight[_KEPT_IN_PLACE] = 0.0
    moved[:, :2] = target_xy + weight[:, None] * (laid - target_xy)
    return moved


def _thumbnail(image: np.ndarray) -> np.ndarray:
    return np.asarray(cv2.resize(image, (STATS_SIZE, STATS_SIZE), interpolation=cv2.INTER_AREA))


def openness(mesh: np.ndarray) -> dict[str, float]:
    """Eye and mouth opening of a mesh, each as the gap over the width of its opening (0 = shut)."""
    xy = np.asarray(mesh, np.float64)[:, :2]

    def ratio(top: int, bottom: int, left: int, right: int) -> float:
        gap = float(np.linalg.norm(xy[top] - xy[bottom]))
        return gap / max(float(np.linalg.norm(xy[left] - xy[right])), 1e-6)

    return {
        "left_eye": ratio(159, 145, 33, 133),
        "right_eye": ratio(386, 374, 362, 263),
        "mouth": ratio(13, 14, 78, 308),
    }
