"""Piecewise-affine warping of a face texture from one 468-point mesh onto another, in one remap.

The target mesh is rasterised on a small grid (every grid pixel learns its triangle and barycentric weights,
all triangles at once with numpy); the weights give, per grid pixel, where to read the source texture and
which canonical texture coordinate (UV) it shows. The source map is upsampled to the crop and applied with
one `cv2.remap`; masks defined once in UV space are read through the UV map, so "brows to chin" follows the
face wherever it turns.
"""

from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np
import numpy.typing as npt

from app.pipeline.landmarks import face_geometry

FloatMap = npt.NDArray[np.float32]

# The face outline in the canonical mesh (MediaPipe's FACEMESH_FACE_OVAL, in order around the face).
FACE_OVAL = (
    10, 338, 297, 332, 284, 251, 389, 356, 454, 323, 361, 288, 397, 365, 379, 378, 400, 377,
    152, 148, 176, 149, 150, 136, 172, 58, 132, 93, 234, 127, 162, 21, 54, 103, 67, 109,
)  # fmt: skip
# Inner lip contour (the mouth opening) and eyelid contours (the eye openings), in order around each hole.
MOUTH_OPENING = (78, 191, 80, 81, 82, 13, 312, 311, 310, 415, 308, 324, 318, 402, 317, 14, 87, 178, 88, 95)
LEFT_EYE_OPENING = (33, 246, 161, 160, 159, 158, 157, 173, 133, 155, 154, 153, 145, 144, 163, 7)
RIGHT_EYE_OPENING = (263, 466, 388, 387, 386, 385, 384, 398, 362, 382, 381, 380, 374, 373, 390, 249)

UV_MASK_SIZE = 256


@dataclass(frozen=True)
class UvMaskShape:
    """The swapped region in canonical texture space, feathered: the face outline shrunk about its centre and
    met by an ellipse that narrows toward the temples (source hair and background show there, and at the cheek
    silhouette of turned heads), cut just above the brows (no hairline or fringe)."""

    shrink: float = 0.9  # the outline, about the face centre
    ellipse: tuple[float, float, float, float] = (0.5, 0.56, 0.36, 0.40)  # centre u, v and semi-axes
    top: float = 0.245  # texture v above which nothing is swapped: brows at v≈0.26, hairline at v≈0.11
    feather: float = 0.025  # Gaussian sigma, in texture units


DEFAULT_UV_MASK = UvMaskShape()


@lru_cache(maxsize=4)
def uv_mask(shape: UvMaskShape = DEFAULT_UV_MASK) -> FloatMap:
    uv = face_geometry().uv
    outline = uv[list(FACE_OVAL)]
    centre = np.array([0.5, 0.55], np.float32)
    polygon = (centre + (outline - centre) * shape.shrink) * UV_MASK_SIZE
    mask = np.zeros((UV_MASK_SIZE, UV_MASK_SIZE), np.float32)
    cv2.fillPoly(mask, [np.round(polygon).astype(np.int32)], 1.0)
    cu, cv, au, av = (value * UV_MASK_SIZE for value in shape.ellipse)
    ellipse = np.zeros_like(mask)
    cv2.ellipse(ellipse, (round(cu), round(cv)), (round(au), round(av)), 0.0, 0.0, 360.0, 1.0, thickness=-1)
    mask *= ellipse
    mask[: round(shape.top * UV_MASK_SIZE)] = 0.0
    sigma = shape.feather * UV_MASK_SIZE
    mask = np.asarray(
        cv2.GaussianBlur(mask, (0, 0), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_CONSTANT), np.float32
    )
    mask[mask < 5e-3] = 0.0
    mask.setflags(write=False)
    return mask


@lru_cache(maxsize=1)
def _front_sign() -> float:
    """The sign of a front-facing triangle's area in image axes (the canonical mesh seen from the front)."""
    geometry = face_geometry()
    xy = geometry.canonical_xyz[:, :2] * np.array([1.0, -1.0], np.float32)
    corners = xy[geometry.triangles].astype(np.float64)
    e1, e2 = corners[:, 1] - corners[:, 0], corners[:, 2] - corners[:, 0]
    return float(np.sign(np.median(e1[:, 0] * e2[:, 1] - e1[:, 1] * e2[:, 0])))


@dataclass
class MeshMaps:
    """Per grid pixel: where to read the source texture (crop pixels) and its texture coordinate; -1 off the
    mesh."""

    source_x: FloatMap
    source_y: FloatMap
    u: FloatMap
    v: FloatMap

    @property
    def covered(self) -> npt.NDArray[np.bool_]:
        return self.u >= 0


def _candidates(corners: np.ndarray, grid: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every (triangle, pixel) pair whose pixel lies in the triangle's bounding box: triangle ids, x, y."""
    low = np.clip(np.floor(corners.min(axis=1)), 0, grid - 1).astype(np.int64)
    high = np.clip(np.ceil(corners.max(axis=1)), 0, grid - 1).astype(np.int64)
    width = np.maximum(high[:, 0] - low[:, 0] + 1, 0)
    height = np.maximum(high[:, 1] - low[:, 1] + 1, 0)
    counts = width * height
    triangle = np.repeat(np.arange(len(corners)), counts)
    # Position of each candidate within its triangle's box, without a Python loop.
    offset = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    box_width = width[triangle]
    x = low[triangle, 0] + offset % np.maximum(box_width, 1)
    y = low[triangle, 1] + offset // np.maximum(box_width, 1)
    return triangle, x, y


def mesh_maps(target: np.ndarray, source: np.ndarray, grid: int, scale: float) -> MeshMaps:
    """Rasterise the `target` mesh (crop pixels) on a grid×grid grid whose pixels are `scale` crop pixels wide,
    reading `source` (crop pixels of the source texture) and the canonical UVs through each triangle."""
    geometry = face_geometry()
    triangles = geometry.triangles
    # Grid pixel j samples crop coordinate (j + 0.5) * scale - 0.5, as cv2.resize upsamples.
    points = (np.asarray(target, np.float64)[:, :2] + 0.5) / scale - 0.5
    corners = points[triangles]  # [T, 3, 2]
    edge1 = corners[:, 1] - corners[:, 0]
    edge2 = corners[:, 2] - corners[:, 0]
    det = edge1[:, 0] * edge2[:, 1] - edge1[:, 1] * edge2[:, 0]
    # Back-facing triangles (the far side of the nose on a turned head) are hidden: leave them out.
    usable = det * _front_sign() > 1e-9
    triangle, x, y = _candidates(corners[usable], grid)
    kept = np.flatnonzero(usable)[triangle]
    dx = x - corners[kept, 0, 0]
    dy = y - corners[kept, 0, 1]
    inv = 1.0 / det[kept]
    w1 = (dx * edge2[kept, 1] - dy * edge2[kept, 0]) * inv
    w2 = (dy * edge1[kept, 0] - dx * edge1[kept, 1]) * inv
    w0 = 1.0 - w1 - w2
    inside = (w0 >= -1e-6) & (w1 >= -1e-6) & (w2 >= -1e-6)
    kept, x, y = kept[inside], x[inside], y[inside]
    w0, w1, w2 = w0[inside], w1[inside], w2[inside]
    corner_ids = triangles[kept]

    def through(values: np.ndarray) -> np.ndarray:
        """Per-vertex values [V, C] interpolated at every kept pixel: [K, C]."""
        at = values[corner_ids]
        return at[:, 0] * w0[:, None] + at[:, 1] * w1[:, None] + at[:, 2] * w2[:, None]

    source_xy = through(np.asarray(source, np.float64)[:, :2])
    uv = through(geometry.uv.astype(np.float64))
    maps = [np.full((grid, grid), -1.0, np.float32) for _ in range(4)]
    for plane, values in zip(maps, (source_xy[:, 0], source_xy[:, 1], uv[:, 0], uv[:, 1]), strict=True):
        plane[y, x] = values
    return MeshMaps(*maps)


def upsample(plane: FloatMap, size: int) -> FloatMap:
    return np.asarray(cv2.resize(plane, (size, size), interpolation=cv2.INTER_LINEAR), np.float32)


def sample_uv_mask(maps: MeshMaps, mask: FloatMap, edge_sigma: float = 1.5) -> FloatMap:
    """The UV-space `mask` read at every grid pixel's texture coordinate, faded out toward the edge of the
    visible mesh (the silhouette of a turned head is an edge in the image that UV space does not see)."""
    size = mask.shape[0]
    read = cv2.remap(mask, maps.u * size - 0.5, maps.v * size - 0.5, cv2.INTER_LINEAR, borderValue=0.0)
    covered = maps.covered.astype(np.float32)
    inner = cv2.erode(covered, np.ones((3, 3), np.uint8), iterations=max(1, round(edge_sigma * 1.5)))
    fade = cv2.GaussianBlur(inner, (0, 0), sigmaX=edge_sigma, sigmaY=edge_sigma)
    return np.asarray(read * fade * covered, np.float32)


def hole_mask(points: np.ndarray, holes: tuple[tuple[int, ...], ...], grid: int, scale: float) -> FloatMap:
    """1 inside each polygon of mesh vertices (mouth and eye openings) on the grid, else 0."""
    mask = np.zeros((grid, grid), np.float32)
    on_grid = (np.asarray(points, np.float64)[:, :2] + 0.5) / scale - 0.5
    polygons = [np.round(on_grid[list(hole)] * 16).astype(np.int32) for hole in holes]
    cv2.fillPoly(mask, polygons, 1.0, lineType=cv2.LINE_AA, shift=4)
    return mask
