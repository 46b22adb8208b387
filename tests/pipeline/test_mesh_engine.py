"""The mesh engine on real photos: it follows the target's expression and pose, keeps the target's mouth
interior and everything outside the face, and carries the source's texture."""

import io

import cv2
import numpy as np
import pytest

from app.errors import UserError
from app.pipeline.align import TEMPLATES, AlignSpec, estimate_matrix, transform_points, warp_crop
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.factory import build_pipeline
from app.pipeline.landmarks import FaceMeshLandmarker, five_points, mesh_template
from app.pipeline.mesh import MeshConfig, MeshEngine, openness, shaped
from app.pipeline.mesh_warp import FACE_OVAL, LEFT_EYE_OPENING, MOUTH_OPENING, RIGHT_EYE_OPENING, hole_mask
from app.pipeline.mouth import OUTER_LIPS
from app.pipeline.pipeline import FramePipeline, PipelineConfig
from app.pipeline.swap import SwapItem
from app.pipeline.types import Face, Image
from app.runtime.onnx import OnnxModel
from app.settings import BatchingSettings, PipelineSettings
from engines.store import ModelStore


@pytest.fixture(scope="module")
def landmarker(store: ModelStore) -> FaceMeshLandmarker:
    return FaceMeshLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=2))


@pytest.fixture(scope="module")
def engine(landmarker: FaceMeshLandmarker) -> MeshEngine:
    return MeshEngine(landmarker)


def _crop(detector: RetinaFaceDetector, image: Image, spec: AlignSpec, index: int = 0) -> Image:
    faces = sorted(detector.process([image])[0], key=lambda f: -f.area)
    return warp_crop(image, estimate_matrix(faces[index].landmarks, spec), spec.size)


def test_the_alignment_template_is_the_canonical_mesh_roi() -> None:
    assert np.allclose(TEMPLATES["face_mesh"], mesh_template(), atol=1e-6)


@pytest.mark.slow
def test_dense_landmarks_land_on_the_detected_face(
    detector: RetinaFaceDetector, landmarker: FaceMeshLandmarker, astronaut: Image, t1: Image
) -> None:
    spec = AlignSpec("face_mesh", 256)
    for image in (astronaut, t1):
        for face in detector.process([image])[0]:
            matrix = estimate_matrix(face.landmarks, spec)
            (mesh,) = landmarker.process([warp_crop(image, matrix, spec.size)])
            assert mesh is not None and mesh.shape == (468, 3)
            found = transform_points(five_points(mesh), cv2.invertAffineTransform(matrix))
            size = float(max(face.box[2] - face.box[0], face.box[3] - face.box[1]))
            # The mesh's eyes, nose tip and mouth corners agree with the detector's within a tenth of the face's
            # size (the two models define the points a little differently, most on turned heads).
            assert np.linalg.norm(found - face.landmarks, axis=1).max() < 0.1 * size
    blank = np.full((256, 256, 3), 128, np.uint8)
    assert landmarker.process([blank]) == [None]


def test_swap_follows_the_target_and_keeps_its_mouth(
    detector: RetinaFaceDetector, landmarker: FaceMeshLandmarker, engine: MeshEngine, astronaut: Image, t1: Image
) -> None:
    source = engine.prepare(t1, max(detector.process([t1])[0], key=lambda f: f.area))
    target = _crop(detector, astronaut, engine.align)
    (out,) = engine.process([SwapItem(target, source)])
    assert out.shape == target.shape and out.dtype == np.uint8
    (target_mesh,) = engine.crop_landmarks.process([target])
    (out_mesh,) = engine.crop_landmarks.process([out])
    assert target_mesh is not None and out_mesh is not None
    source_mesh = source.data["mesh"][0]
    # Expression and pose follow the target: the output's landmarks are much nearer the target's than the
    # source's are (both in the same aligned frame).
    eye_distance = float(np.linalg.norm(five_points(target_mesh)[0] - five_points(target_mesh)[1]))
    to_target = np.linalg.norm(out_mesh[:, :2] - target_mesh[:, :2], axis=1).mean() / eye_distance
    source_to_target = np.linalg.norm(source_mesh[:, :2] - target_mesh[:, :2], axis=1).mean() / eye_distance
    assert to_target < 0.5 * source_to_target, (to_target, source_to_target)
    # The face changed; the crop's border (hair, background) did not change at all.
    changed = np.any(out != target, axis=2)
    assert changed.mean() > 0.1
    border = np.ones_like(changed)
    border[12:-12, 12:-12] = False
    assert not changed[border].any()
    # The astronaut smiles with her teeth showing: the inside of her mouth is her own.
    assert openness(target_mesh)["mouth"] > 0.05
    mouth = hole_mask(target_mesh, (MOUTH_OPENING,), out.shape[0], 1.0)
    inner = cv2.erode(mouth, np.ones((5, 5), np.uint8)) > 0.99
    assert inner.sum() > 30
    assert np.abs(out[inner].astype(int) - target[inner].astype(int)).max() <= 6


def test_prepared_source_survives_the_identity_store_format(
    detector: RetinaFaceDetector, engine: MeshEngine, t1: Image
) -> None:
    source = engine.prepare(t1, detector.process([t1])[0][0])
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(source.data), allow_pickle=False)
    buffer.seek(0)
    loaded = np.load(buffer, allow_pickle=False)
    assert loaded.dtype == source.data.dtype and np.array_equal(loaded["texture"], source.data["texture"])


def test_no_face_in_the_crop_leaves_it_unchanged(detector: RetinaFaceDetector, engine: MeshEngine, t1: Image) -> None:
    source = engine.prepare(t1, detector.process([t1])[0][0])
    blank = np.full((engine.align.size, engine.align.size, 3), 90, np.uint8)
    (out,) = engine.process([SwapItem(blank, source)])
    assert np.array_equal(out, blank)


def test_pipeline_with_the_mesh_engine_swaps_every_face(
    detector: RetinaFaceDetector, engine: MeshEngine, astronaut: Image, t1: Image
) -> None:
    pipeline = FramePipeline(detector, engine, config=PipelineConfig())
    source = pipeline.prepare_source(astronaut)
    result = pipeline.swap_image(t1, source)
    assert len(result.faces) == 6
    for face in result.faces:
        x0, y0, x1, y1 = (int(v) for v in face.box)
        assert np.any(result.image[y0:y1, x0:x1] != t1[y0:y1, x0:x1])


def test_the_server_path_batches_the_mesh_engine_like_any_stage(store: ModelStore, astronaut: Image, t1: Image) -> None:
    settings = PipelineSettings(engine="mesh", threads=1)
    direct = build_pipeline(settings, store)
    shared = build_pipeline(settings, store, batching=BatchingSettings())
    try:
        source = direct.prepare_source(astronaut)
        frames = [t1, astronaut]
        alone = [r.image for r in direct.process(frames, source)]
        together = [r.image for r in shared.process(frames, source, session="a")]
        assert shared.engine.name == "mesh"
        for a, b in zip(alone, together, strict=True):
            # The shared detector letterboxes frames onto one canvas, so faces sit a fraction of a pixel apart.
            assert np.abs(a.astype(float) - b.astype(float)).mean() < 0.5
        assert np.abs(together[0].astype(float) - t1.astype(float)).mean() > 1.0  # t1's six faces were swapped
    finally:
        shared.close()
        direct.close()


def test_a_source_without_a_face_for_the_landmarks_is_a_user_error(engine: MeshEngine, astronaut: Image) -> None:
    wall = np.full_like(astronaut, 128)
    points = np.array([[200, 200], [260, 200], [230, 240], [205, 270], [255, 270]], np.float32)
    with pytest.raises(UserError, match="no face"):
        engine.prepare(wall, Face(np.array([170, 150, 290, 310], np.float32), 0.9, points))


def test_shape_moves_the_inner_face_toward_the_source_but_not_lips_lids_or_outline(
    detector: RetinaFaceDetector, engine: MeshEngine, astronaut: Image, t1: Image
) -> None:
    source = engine.prepare(t1, max(detector.process([t1])[0], key=lambda f: f.area))
    target = _crop(detector, astronaut, engine.align)
    (target_mesh,) = engine.crop_landmarks.process([target])
    assert target_mesh is not None
    source_mesh = source.data["mesh"][0]
    half = shaped(target_mesh, source_mesh, 0.5)
    kept = sorted({*FACE_OVAL, *OUTER_LIPS, *MOUTH_OPENING, *LEFT_EYE_OPENING, *RIGHT_EYE_OPENING})
    assert np.array_equal(half[kept], target_mesh[kept])
    moved = np.linalg.norm(half[:, :2] - target_mesh[:, :2], axis=1)
    assert moved.max() > 1.0 and np.count_nonzero(moved > 1e-6) > 100
    assert np.array_equal(shaped(target_mesh, source_mesh, 0.0), target_mesh)
    with_shape = MeshEngine(engine.landmarker, MeshConfig(shape=0.5))
    (plain,) = engine.process([SwapItem(target, source)])
    (pulled,) = with_shape.process([SwapItem(target, source)])
    assert np.abs(plain.astype(int) - pulled.astype(int)).mean() > 0.2
