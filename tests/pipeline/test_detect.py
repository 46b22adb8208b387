"""RetinaFace decoding on real photos."""

import cv2
import numpy as np

from app.pipeline.align import transform_points
from app.pipeline.detect import RetinaFaceDetector, priors
from app.pipeline.types import Image


def test_finds_all_six_faces_in_the_group_photo(detector: RetinaFaceDetector, t1: Image) -> None:
    (faces,) = detector.process([t1])
    assert len(faces) == 6
    for face in faces:
        x1, y1, x2, y2 = face.box
        # Landmarks lie inside their box, eyes above the mouth.
        assert np.all((face.landmarks[:, 0] > x1) & (face.landmarks[:, 0] < x2))
        assert np.all((face.landmarks[:, 1] > y1) & (face.landmarks[:, 1] < y2))
        assert face.landmarks[0, 1] < face.landmarks[3, 1] and face.landmarks[1, 1] < face.landmarks[4, 1]
        assert face.landmarks[0, 0] < face.landmarks[1, 0]  # left eye is left in the image


def test_finds_the_astronaut(detector: RetinaFaceDetector, astronaut: Image) -> None:
    (faces,) = detector.process([astronaut])
    assert len(faces) == 1
    x1, y1, x2, y2 = faces[0].box
    assert 150 < (x1 + x2) / 2 < 280 and 60 < (y1 + y2) / 2 < 200


def test_a_batch_of_mixed_sizes_equals_single_calls(detector: RetinaFaceDetector, t1: Image, astronaut: Image) -> None:
    batched = detector.process([t1, astronaut])
    alone = [detector.process([t1])[0], detector.process([astronaut])[0]]
    assert [len(f) for f in batched] == [6, 1]
    for got, want in zip(batched, alone, strict=True):
        got_sorted = sorted(got, key=lambda f: f.box[0])
        want_sorted = sorted(want, key=lambda f: f.box[0])
        for a, b in zip(got_sorted, want_sorted, strict=True):
            # Letterbox padding changes the input, not the face: sub-pixel agreement.
            assert np.abs(a.landmarks - b.landmarks).max() < 1.0


def test_no_face_in_a_plain_image(detector: RetinaFaceDetector) -> None:
    sky = np.full((360, 480, 3), (200, 160, 90), np.uint8)
    assert detector.process([sky]) == [[]]


def test_landmarks_follow_a_known_similarity_transform(detector: RetinaFaceDetector, astronaut: Image) -> None:
    (base,) = detector.process([astronaut])
    for angle, scale in ((12.0, 1.0), (-8.0, 0.8), (5.0, 1.25), (0.0, 0.6)):
        matrix = cv2.getRotationMatrix2D((256.0, 256.0), angle, scale)
        moved = cv2.warpAffine(astronaut, matrix, (512, 512), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
        (found,) = detector.process([moved])
        face = max(found, key=lambda f: f.area)
        back = transform_points(face.landmarks, cv2.invertAffineTransform(matrix))
        error = np.linalg.norm(back - base[0].landmarks, axis=1)
        assert error.max() < 2.0, (angle, scale, error)


def test_priors_cover_every_stride() -> None:
    anchors = priors(640, 480)
    expected = sum(2 * -(-640 // s) * -(-480 // s) for s in (8, 16, 32))
    assert anchors.shape == (expected, 4)
    assert anchors[0].tolist() == [4.0, 4.0, 16.0, 16.0]
