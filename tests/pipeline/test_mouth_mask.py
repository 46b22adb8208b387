"""The mouth mask keeps the target's own mouth for any engine: lips and inside at 1, fading toward the chin; item by
item, so one shared engine serves streams with and without it."""

import cv2
import numpy as np
import pytest

from app.pipeline.align import estimate_matrix, warp_crop
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.factory import build_swap_engine
from app.pipeline.landmarks import CropLandmarks, FaceMeshLandmarker
from app.pipeline.mesh import MeshConfig, MeshEngine
from app.pipeline.mouth import OUTER_LIPS, KeepsMouth, MouthKeepingEngine, mouth_region
from app.pipeline.swap import ClassicEngine, SwapEngine, SwapItem
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from app.settings import PipelineSettings
from engines.store import ModelStore


@pytest.fixture(scope="module")
def landmarker(store: ModelStore) -> FaceMeshLandmarker:
    return FaceMeshLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=2))


def test_classic_with_the_mouth_mask_keeps_the_target_mouth(
    detector: RetinaFaceDetector, landmarker: FaceMeshLandmarker, astronaut: Image, t1: Image
) -> None:
    inner = ClassicEngine()
    source = inner.prepare(t1, detector.process([t1])[0][0])
    face = detector.process([astronaut])[0][0]
    crop = warp_crop(astronaut, estimate_matrix(face.landmarks, inner.align), inner.align.size)
    item = SwapItem(crop, source)
    plain = inner.process([item])[0]
    kept = MouthKeepingEngine(inner, landmarker, 1.0)
    assert (kept.name, kept.model_key, kept.align) == (inner.name, inner.model_key, inner.align)
    (out,) = kept.process([item])
    (mesh,) = kept.landmarks([crop])
    assert mesh is not None
    region = mouth_region(mesh, crop.shape[:2])
    lips = region >= 0.999
    assert lips.sum() > 200
    # On the lips and inside: the target's own pixels. Far from the mouth (the eyes): the engine's output.
    assert np.abs(out[lips].astype(int) - crop[lips].astype(int)).max() <= 1
    far = region == 0
    assert np.array_equal(out[far], plain[far])
    # The region is where the mesh puts the mouth of the aligned face (about 0.72 of the crop down), not the eyes.
    for x, y in np.round(mesh[list(OUTER_LIPS), :2]).astype(int):
        assert region[y, x] >= 0.5
    assert 0.65 < mesh[list(OUTER_LIPS), 1].mean() / crop.shape[0] < 0.8
    assert region[: crop.shape[0] // 2].max() == 0
    # Half the amount: half way between.
    (half,) = MouthKeepingEngine(inner, landmarker, 0.5).process([item])
    middle = (crop[lips].astype(float) + plain[lips].astype(float)) / 2
    assert np.abs(half[lips] - middle).max() <= 1.0


def test_settings_wrap_every_engine_but_mesh(store: ModelStore) -> None:
    wrapped = build_swap_engine(PipelineSettings(engine="classic", mouth_mask=0.7, threads=1), store)
    assert isinstance(wrapped, MouthKeepingEngine) and wrapped.amount == pytest.approx(0.7)
    assert isinstance(build_swap_engine(PipelineSettings(engine="classic", threads=1), store), ClassicEngine)
    mesh = build_swap_engine(PipelineSettings(engine="mesh", mouth_mask=0.7, threads=1), store)
    assert mesh.name == "mesh" and not isinstance(mesh, MouthKeepingEngine)


def _crop(engine: SwapEngine, detector: RetinaFaceDetector, image: Image) -> Image:
    face = max(detector.process([image])[0], key=lambda f: f.area)
    return warp_crop(image, estimate_matrix(face.landmarks, engine.align), engine.align.size)


@pytest.mark.parametrize("which", ["classic", "mesh", "mesh_colour_off"])
def test_one_engine_keeps_the_mouth_item_by_item(
    which: str, detector: RetinaFaceDetector, landmarker: FaceMeshLandmarker, astronaut: Image, t1: Image
) -> None:
    """Two items in one batch through one engine (as the shared batcher sends them), one keeping the mouth and one
    not: they differ on the mouth and nowhere far from it."""
    engine: SwapEngine
    if which == "classic":
        engine = MouthKeepingEngine(ClassicEngine(), landmarker, 1.0)  # wrapped by the server's setting: on
    else:  # the server's setting 0: off unless an item asks
        engine = MeshEngine(landmarker, MeshConfig(color_strength=0.0 if which == "mesh_colour_off" else 1.0))
    assert isinstance(engine, KeepsMouth) and engine.mouth_default is (which == "classic")
    source = engine.prepare(t1, max(detector.process([t1])[0], key=lambda f: f.area))
    crop = _crop(engine, detector, astronaut)
    kept, swapped, default = engine.process(
        [SwapItem(crop, source, keep_mouth=True), SwapItem(crop, source, keep_mouth=False), SwapItem(crop, source)]
    )
    assert np.array_equal(kept if engine.mouth_default else swapped, default)  # not said: the server's setting
    (mesh,) = CropLandmarks(landmarker, engine.align).process([crop])
    assert mesh is not None
    region = mouth_region(mesh, crop.shape[:2])
    # The lips, a few pixels in from their edge (the mesh engine draws the region on its coarser grid).
    lips = cv2.erode((region >= 0.999).astype(np.uint8), np.ones((7, 7), np.uint8)) > 0
    assert lips.sum() > 500
    diff = np.abs(kept.astype(int) - swapped.astype(int)).max(axis=2)
    # On the lips: the target's own pixels where kept, the engine's where not.
    assert np.abs(kept[lips].astype(int) - crop[lips].astype(int)).max() <= 2
    assert diff[lips].mean() > 10
    # Away from the mouth (a few pixels' margin: the mesh engine draws the region on its coarser grid) the two are
    # the same; the mesh engine's colour match, measured under its mask, moves by a few grey levels (4 measured).
    near = cv2.dilate((region > 0).astype(np.uint8), np.ones((9, 9), np.uint8)) > 0
    assert diff[~near].max() <= (6 if which == "mesh" else 0), which
    assert diff[near].mean() > 5 * max(diff[~near].mean(), 0.1)
