"""Upload warnings: a source photo with an open mouth or closed eyes is flagged, with the reason."""

import cv2
import pytest

from app.identity.enrol import enrol
from app.identity.photo_check import source_warnings
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.landmarks import FaceMeshLandmarker
from app.pipeline.mesh import MeshEngine
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import ClassicEngine, PreparedSource
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


@pytest.fixture(scope="module")
def engine(store: ModelStore) -> MeshEngine:
    return MeshEngine(FaceMeshLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=2)))


def test_open_mouth_is_flagged_and_closed_lips_are_not(
    detector: RetinaFaceDetector, engine: MeshEngine, astronaut: Image, t1: Image
) -> None:
    smiling = engine.prepare(astronaut, detector.process([astronaut])[0][0])  # a smile that shows the teeth
    (warning,) = source_warnings(smiling)
    assert "mouth is open" in warning
    faces = sorted(detector.process([t1])[0], key=lambda f: float(f.box[0]))
    closed = engine.prepare(t1, faces[0])  # lips together, eyes open
    assert source_warnings(closed) == []
    # The same face with its lids brought together is flagged for closed eyes.
    record = closed.data.copy()
    mesh = record["mesh"][0]
    for top, bottom in ((159, 145), (386, 374)):
        mesh[top, :2] = mesh[bottom, :2]
    record["mesh"][0] = mesh
    assert any("eyes are closed" in w for w in source_warnings(PreparedSource("mesh", closed.model_key, record)))


def test_engines_without_landmarks_give_no_warnings(detector: RetinaFaceDetector, astronaut: Image) -> None:
    prepared = ClassicEngine().prepare(astronaut, detector.process([astronaut])[0][0])
    assert source_warnings(prepared) == []


def test_enrolment_carries_the_warnings(detector: RetinaFaceDetector, engine: MeshEngine, astronaut: Image) -> None:
    ok, png = cv2.imencode(".png", astronaut)
    assert ok
    enrolment = enrol(FramePipeline(detector, engine), png.tobytes(), max_pixels=4096 * 4096, face_index=None)
    assert enrolment.prepared.model_key.startswith("mesh")
    (warning,) = enrolment.warnings
    assert "mouth is open" in warning
