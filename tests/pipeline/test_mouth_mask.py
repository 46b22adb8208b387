"""The mouth mask keeps the target's own mouth for any engine: lips and inside at 1, fading toward the chin."""

import numpy as np
import pytest

from app.pipeline.align import estimate_matrix, warp_crop
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.factory import build_swap_engine
from app.pipeline.landmarks import FaceMeshLandmarker
from app.pipeline.mouth import OUTER_LIPS, MouthKeepingEngine, mouth_region
from app.pipeline.swap import ClassicEngine, SwapItem
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
