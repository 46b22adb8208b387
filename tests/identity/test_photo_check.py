"""Upload warnings: a source photo with an open mouth or closed eyes is flagged, with the reason."""

import cv2
import numpy as np
import pytest

from app.identity.enrol import enrol
from app.identity.eye_state import EyeOpenness, eye_roi, load_eye_openness
from app.identity.photo_check import source_warnings
from app.media.clips import load_sample, sample_faces
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.landmarks import FaceMeshLandmarker
from app.pipeline.mesh import MeshEngine
from app.pipeline.pipeline import FramePipeline
from app.pipeline.swap import ClassicEngine
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


@pytest.fixture(scope="module")
def engine(store: ModelStore) -> MeshEngine:
    return MeshEngine(FaceMeshLandmarker(OnnxModel(store.ensure("face_mesh_468"), threads=2)))


@pytest.fixture(scope="module")
def eyes(store: ModelStore) -> EyeOpenness:
    return load_eye_openness(store, threads=2)


def eye_warnings(warnings: list[str]) -> list[str]:
    return [w for w in warnings if "eyes are closed" in w]


def test_open_mouth_is_flagged_and_closed_lips_are_not(
    detector: RetinaFaceDetector, engine: MeshEngine, eyes: EyeOpenness, astronaut: Image, t1: Image
) -> None:
    smiling = engine.prepare(astronaut, detector.process([astronaut])[0][0])  # a smile that shows the teeth
    (warning,) = source_warnings(smiling, eyes)
    assert "mouth is open" in warning
    faces = sorted(detector.process([t1])[0], key=lambda f: float(f.box[0]))
    closed = engine.prepare(t1, faces[0])  # lips together, eyes open
    assert source_warnings(closed, eyes) == []


def test_closed_eyes_are_flagged_on_a_real_photo_and_open_ones_are_not(
    detector: RetinaFaceDetector, engine: MeshEngine, eyes: EyeOpenness, t1: Image
) -> None:
    # t1.jpg: the right-most face has its eyes shut; the others have them open (one looks down, lids lowered;
    # one laughs with one eye nearly shut).
    faces = sorted(detector.process([t1])[0], key=lambda f: float(f.box[0]))
    assert len(faces) == 6
    found = [eye_warnings(source_warnings(engine.prepare(t1, face), eyes)) for face in faces]
    assert [bool(w) for w in found] == [False] * 5 + [True]
    (warning,) = found[-1]
    assert "closed lids may show over open eyes" in warning and "lid opening 0.0" in warning


def test_open_eyes_in_other_sample_photos_are_not_flagged(
    detector: RetinaFaceDetector, engine: MeshEngine, eyes: EyeOpenness
) -> None:
    names = [name for name in ("astronaut", "tom_hanks", "grace_hopper") if name in sample_faces()]
    assert "astronaut" in names
    for name in names:
        image = load_sample(name)
        face = max(detector.process([image])[0], key=lambda f: f.area)
        assert eye_warnings(source_warnings(engine.prepare(image, face), eyes)) == [], name


def test_the_measure_follows_the_eye_not_the_frame(
    detector: RetinaFaceDetector, engine: MeshEngine, eyes: EyeOpenness, t1: Image
) -> None:
    """The same face mirrored measures the same (each eye is framed upright and the right one mirrored), and
    the eye ROI puts the eye's corners level, at the same places for either eye, the square's side 2.3 times the
    corners' larger offset."""
    face = max(detector.process([t1])[0], key=lambda f: float(f.box[0]))
    prepared = engine.prepare(t1, face)
    texture, mesh = prepared.data["texture"][0], prepared.data["mesh"][0]
    left, right = eyes.measure(texture, mesh)
    mirrored = np.ascontiguousarray(texture[:, ::-1])
    flipped = engine.prepare(mirrored, detector.process([mirrored])[0][0])
    assert max(eyes.measure(flipped.data["texture"][0], flipped.data["mesh"][0])) == pytest.approx(
        max(left, right), abs=0.02
    )
    a, b = np.array([10.0, 20.0]), np.array([40.0, 30.0])
    for mirror in (False, True):
        matrix = eye_roi(a, b, mirror)
        ends = cv2.transform(np.array([[a, b]]), matrix)[0]
        assert ends[0, 1] == pytest.approx(ends[1, 1]) == pytest.approx(32.0)
        half = 32 * float(np.linalg.norm(b - a)) / (2.3 * 30)
        assert sorted(ends[:, 0]) == pytest.approx([32 - half, 32 + half])


def test_engines_without_landmarks_give_no_warnings(
    detector: RetinaFaceDetector, eyes: EyeOpenness, astronaut: Image
) -> None:
    prepared = ClassicEngine().prepare(astronaut, detector.process([astronaut])[0][0])
    assert source_warnings(prepared, eyes) == []


def test_enrolment_carries_the_warnings(
    detector: RetinaFaceDetector, engine: MeshEngine, eyes: EyeOpenness, astronaut: Image, t1: Image
) -> None:
    ok, png = cv2.imencode(".png", astronaut)
    assert ok
    enrolment = enrol(FramePipeline(detector, engine), png.tobytes(), max_pixels=4096 * 4096, face_index=None)
    assert enrolment.prepared.model_key.startswith("mesh")
    (warning,) = enrolment.warnings
    assert "mouth is open" in warning
    # The shut-eyed face of the group photo, chosen by its index (faces in the detector's order).
    faces = detector.process([t1])[0]
    shut = max(range(len(faces)), key=lambda i: float(faces[i].box[0]))
    ok, jpeg = cv2.imencode(".jpg", t1, [cv2.IMWRITE_JPEG_QUALITY, 95])
    assert ok
    pipeline = FramePipeline(detector, engine)
    chosen = enrol(pipeline, jpeg.tobytes(), max_pixels=4096 * 4096, face_index=shut, eyes=eyes)
    assert eye_warnings(chosen.warnings)
    # Without the eye model the eyes are not judged.
    assert not eye_warnings(enrol(pipeline, jpeg.tobytes(), max_pixels=4096 * 4096, face_index=shut).warnings)
