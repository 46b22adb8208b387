"""The mesh engine's per-frame array work (row-span rasterising, the maps upsampled and remapped over the mask's
box only, colour moved in 8-bit LAB) gives what the straightforward formulation gives: the same maps, and a
swapped face a fifth of a grey level from the float-LAB, whole-crop composition on average (3 levels at the
99.9th percentile) on the packaged faces."""

import cv2
import numpy as np
import pytest

from app.pipeline.align import AlignSpec, estimate_matrix, warp_crop
from app.pipeline.color import lab_stats, transfer_color
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.landmarks import FaceMeshLandmarker, face_geometry
from app.pipeline.mesh import GAIN_LIMITS, MeshConfig, MeshEngine, _thumbnail
from app.pipeline.mesh_warp import MeshMaps, _front_sign, mesh_maps, sample_uv_mask, upsample, upsample_box, uv_mask
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


def reference_maps(target: np.ndarray, source: np.ndarray, grid: int, scale: float) -> MeshMaps:
    """Every pixel of every front-facing triangle's bounding box tested by its barycentric weights, one pixel at a
    time per triangle (slow, plain): the definition `mesh_maps` must meet."""
    geometry = face_geometry()
    points = (np.asarray(target, np.float64)[:, :2] + 0.5) / scale - 0.5
    values = np.hstack([np.asarray(source, np.float64)[:, :2], geometry.uv.astype(np.float64)])
    planes = np.full((4, grid, grid), -1.0, np.float32)
    for corner_ids in geometry.triangles:
        (x0, y0), (x1, y1), (x2, y2) = points[corner_ids]
        det = (x1 - x0) * (y2 - y0) - (y1 - y0) * (x2 - x0)
        if not det * _front_sign() > 1e-9:
            continue
        xs = np.arange(max(0, int(np.floor(min(x0, x1, x2)))), min(grid - 1, int(np.ceil(max(x0, x1, x2)))) + 1)
        ys = np.arange(max(0, int(np.floor(min(y0, y1, y2)))), min(grid - 1, int(np.ceil(max(y0, y1, y2)))) + 1)
        gx, gy = np.meshgrid(xs, ys)
        w1 = ((gx - x0) * (y2 - y0) - (gy - y0) * (x2 - x0)) / det
        w2 = ((gy - y0) * (x1 - x0) - (gx - x0) * (y1 - y0)) / det
        w0 = 1.0 - w1 - w2
        inside = (w0 >= -1e-6) & (w1 >= -1e-6) & (w2 >= -1e-6)
        corner_values = values[corner_ids]
        for plane in range(4):
            mixed = w0 * corner_values[0, plane] + w1 * corner_values[1, plane] + w2 * corner_values[2, plane]
            planes[plane][gy[inside], gx[inside]] = mixed[inside]
    return MeshMaps(*planes)


def reference_swap(engine: MeshEngine, target: Image, record: np.ndarray, target_mesh: np.ndarray) -> Image:
    """The swap composed the plain way: the reference maps, the whole crop remapped, colour moved in float LAB,
    blended in float."""
    size = engine.config.size
    texture, source_mesh = record["texture"][0], record["mesh"][0]
    maps = reference_maps(target_mesh, source_mesh, engine.grid, engine.scale)
    mask = sample_uv_mask(maps, uv_mask()) * (1.0 - engine._holes(target_mesh))
    alpha = upsample(mask, size)
    warped = np.asarray(
        cv2.remap(
            texture,
            upsample(maps.source_x, size),
            upsample(maps.source_y, size),
            cv2.INTER_LINEAR,
            borderMode=cv2.BORDER_REPLICATE,
        ),
        np.uint8,
    )
    small_alpha = _thumbnail(alpha).astype(np.float32)
    face_stats = lab_stats(_thumbnail(warped).astype(np.uint8), small_alpha)
    target_stats = lab_stats(_thumbnail(target).astype(np.uint8), small_alpha)
    spread = np.clip(target_stats[1], face_stats[1] * GAIN_LIMITS[0], face_stats[1] * GAIN_LIMITS[1])
    moved = transfer_color(warped, face_stats, (target_stats[0], spread))
    out = target.astype(np.float32) + alpha[..., None] * (moved - target.astype(np.float32))
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def engine(store: ModelStore) -> MeshEngine:
    return MeshEngine(FaceMeshLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=2)))


def faces_of(detector: RetinaFaceDetector, image: Image, spec: AlignSpec) -> list[Image]:
    return [warp_crop(image, estimate_matrix(f.landmarks, spec), spec.size) for f in detector.process([image])[0]]


def test_rasterised_maps_are_the_per_triangle_definition(
    detector: RetinaFaceDetector, engine: MeshEngine, astronaut: Image, t1: Image
) -> None:
    crops = faces_of(detector, t1, engine.align) + faces_of(detector, astronaut, engine.align)
    meshes = [mesh for mesh in engine.crop_landmarks.process(crops) if mesh is not None]
    assert len(meshes) >= 3
    rng = np.random.default_rng(0)
    source = meshes[0]
    # Real meshes, the same meshes shaken by a pixel and a half, and turned into a profile (squeezed on one
    # side, so triangles fold over and face away).
    turned = meshes[1].copy()
    turned[:, 0] = np.where(turned[:, 0] < 144, 144 - (144 - turned[:, 0]) * 0.2, turned[:, 0])
    shaken = [m + np.hstack([rng.normal(0, 1.5, (468, 2)), np.zeros((468, 1))]).astype(np.float32) for m in meshes]
    for target in [*meshes, *shaken, turned]:
        for grid, scale in ((engine.grid, engine.scale), (96, 3.0)):
            fast, plain = mesh_maps(target, source, grid, scale), reference_maps(target, source, grid, scale)
            assert np.array_equal(fast.covered, plain.covered)
            assert fast.covered.sum() > 0.2 * grid * grid
            for name in ("source_x", "source_y", "u", "v"):
                assert np.max(np.abs(getattr(fast, name) - getattr(plain, name))) <= 1e-4, name


def test_the_swapped_face_is_within_a_few_grey_levels_of_the_plain_composition(
    detector: RetinaFaceDetector, engine: MeshEngine, astronaut: Image, t1: Image
) -> None:
    sources = [
        engine.prepare(t1, max(detector.process([t1])[0], key=lambda f: f.area)),
        engine.prepare(astronaut, detector.process([astronaut])[0][0]),
    ]
    targets = faces_of(detector, t1, engine.align) + faces_of(detector, astronaut, engine.align)
    compared = 0
    for target, mesh in zip(targets, engine.crop_landmarks.process(targets), strict=True):
        if mesh is None:
            continue
        for source in sources:
            fast = engine.swap_one(target, source.data, mesh)
            plain = reference_swap(engine, target, source.data, mesh)
            difference = np.abs(fast.astype(np.int16) - plain.astype(np.int16))
            # 8-bit LAB rounds a/b to whole units (×1.5 at most by the gain limits): a few grey levels on
            # saturated pixels, a fifth of a level on average.
            assert difference.mean() <= 0.3 and np.percentile(difference, 99.9) <= 3 and difference.max() <= 8, (
                difference.mean(),
                np.percentile(difference, 99.9),
                difference.max(),
            )
            assert np.any(fast != target)
            compared += 1
    assert compared >= 4


def test_a_mesh_config_without_colour_transfer_blends_the_warped_face_as_it_is(
    detector: RetinaFaceDetector, engine: MeshEngine, t1: Image
) -> None:
    plain = MeshEngine(engine.landmarker, MeshConfig(color_strength=0.0))
    source = plain.prepare(t1, max(detector.process([t1])[0], key=lambda f: f.area))
    (target,) = faces_of(detector, t1, plain.align)[:1]
    (mesh,) = plain.crop_landmarks.process([target])
    assert mesh is not None
    out = plain.swap_one(target, source.data, mesh)
    coloured = engine.swap_one(target, source.data, mesh)
    assert np.any(out != target) and np.any(out != coloured)


@pytest.mark.parametrize(("grid", "size"), [(144, 288), (96, 288), (100, 288), (144, 144), (144, 100)])
def test_the_boxed_upsample_is_the_whole_upsample_over_the_weights_box(grid: int, size: int) -> None:
    """Value for value where the weight is non-zero, and nothing non-zero left out; 100 → 288 and 144 → 100 are
    no whole factor (the whole resize, cut to the box)."""
    rng = np.random.default_rng(5)
    weight = np.zeros((grid, grid), np.float32)
    weight[grid // 5 : grid * 3 // 4, grid // 4 : grid * 2 // 3] = rng.random((1, 1), np.float32) + 0.1
    weight = np.asarray(cv2.GaussianBlur(weight, (0, 0), 2.0), np.float32)
    weight[weight < 1e-3] = 0.0
    others = tuple(rng.normal(100.0, 40.0, (2, grid, grid)).astype(np.float32))
    boxed = upsample_box(weight, others, size)
    assert boxed is not None
    (y0, y1, x0, x1), values, moved = boxed
    for plane, got in zip((weight, *others), (values, *moved), strict=True):
        whole = upsample(plane, size)
        assert got.shape == (y1 - y0, x1 - x0)
        assert np.max(np.abs(got - whole[y0:y1, x0:x1])) <= 1e-4
    whole = upsample(weight, size)
    rows, cols = np.flatnonzero(whole.max(axis=1) > 0), np.flatnonzero(whole.max(axis=0) > 0)
    assert (y0, y1, x0, x1) == (rows[0], rows[-1] + 1, cols[0], cols[-1] + 1)
    assert (y1 - y0) * (x1 - x0) < 0.65 * size * size
    assert upsample_box(np.zeros((grid, grid), np.float32), others, size) is None
