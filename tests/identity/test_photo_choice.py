"""Identities from several photos: the texture engines take the most frontal, best-exposed photo; inswapper the
normalised mean of every photo's ArcFace embedding."""

import cv2
import numpy as np
import pytest

from app.identity.photo_choice import SourcePhoto, best_photo, prepare_from_photos, score
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.identity_map import mean_embedding
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.swap import ClassicEngine, InswapperEngine
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


def turned(image: Image, face_x: float, squeeze: float = 0.45) -> Image:
    """The photo with everything right of `face_x` squeezed sideways: the face looks turned (its far half
    narrower, the nose off the eyes' midline)."""
    height, width = image.shape[:2]
    xs = np.arange(width, dtype=np.float32)
    source_x = np.where(xs < face_x, xs, face_x + (xs - face_x) / squeeze).astype(np.float32)
    map_x = np.tile(source_x, (height, 1))
    map_y = np.tile(np.arange(height, dtype=np.float32)[:, None], (1, width))
    return np.asarray(cv2.remap(image, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_REPLICATE), np.uint8)


def darker(image: Image, gain: float = 0.3) -> Image:
    return np.clip(image.astype(np.float32) * gain, 0, 255).astype(np.uint8)


def photos_of(detector: RetinaFaceDetector, images: list[Image]) -> list[SourcePhoto]:
    found = detector.process(images)
    return [SourcePhoto(image, max(faces, key=lambda f: f.area)) for image, faces in zip(images, found, strict=True)]


@pytest.fixture(scope="module")
def astronaut_photos(detector: RetinaFaceDetector, astronaut: Image) -> list[SourcePhoto]:
    """Three photos of one person: turned, dark, and frontal and well lit (the one to choose), in that order."""
    (faces,) = detector.process([astronaut])
    nose_x = float(max(faces, key=lambda f: f.area).landmarks[2][0])
    return photos_of(detector, [turned(astronaut, nose_x), darker(astronaut), astronaut])


def test_the_frontal_well_lit_photo_scores_best(astronaut_photos: list[SourcePhoto]) -> None:
    side, dark, good = (score(p) for p in astronaut_photos)
    assert good.frontality > side.frontality + 0.2
    assert good.exposure > dark.exposure + 0.15
    assert best_photo(astronaut_photos) == 2


def test_classic_prepares_the_chosen_photo(astronaut_photos: list[SourcePhoto]) -> None:
    engine = ClassicEngine()
    prepared, used = prepare_from_photos(engine, astronaut_photos)
    assert used == 2
    good = astronaut_photos[2]
    assert np.array_equal(prepared.data, engine.prepare(good.image, good.face).data)


def test_inswapper_prepares_the_mean_of_every_photos_embedding(
    store: ModelStore, astronaut_photos: list[SourcePhoto]
) -> None:
    # The reference networks have the real models' contracts (untrained): the arithmetic is what is checked.
    recognizer = ArcFaceRecognizer(OnnxModel(store.ensure("reference_recognizer"), threads=1))
    engine = InswapperEngine(OnnxModel(store.ensure("reference_swapper_narrow"), threads=1), recognizer)
    try:
        prepared, used = prepare_from_photos(engine, astronaut_photos)
        embeddings = [recognizer.embed(p.image, p.face) for p in astronaut_photos]
        mean = np.mean(embeddings, axis=0)
        expected = engine.latent(mean / np.linalg.norm(mean))
        assert used is None
        np.testing.assert_allclose(prepared.data, expected, atol=1e-6)
        np.testing.assert_allclose(mean_embedding(embeddings), mean / np.linalg.norm(mean), atol=1e-6)
        for single in embeddings:  # not any one photo's
            assert not np.allclose(prepared.data, engine.latent(single), atol=1e-4)
    finally:
        engine.close()
