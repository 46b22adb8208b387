"""Our inswapper path against insightface's INSwapper on the same (narrow reference) network."""

import contextlib
import io

import numpy as np
import pytest
from insightface.app.common import Face as InsightFace
from insightface.model_zoo.inswapper import INSwapper
from insightface.utils import face_align

from app.pipeline.align import align_faces
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.swap import InswapperEngine, SwapItem
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


@pytest.fixture(scope="module")
def engine(store: ModelStore) -> InswapperEngine:
    recognizer = ArcFaceRecognizer(OnnxModel(store.ensure("reference_recognizer"), threads=2))
    return InswapperEngine(OnnxModel(store.ensure("reference_swapper_narrow"), threads=2), recognizer)


@pytest.fixture(scope="module")
def theirs(engine: InswapperEngine) -> INSwapper:
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its input shape
        return INSwapper(model_file=str(engine.swapper.path))


def test_same_crop_latent_and_swap_as_insightface(
    engine: InswapperEngine, theirs: INSwapper, detector: RetinaFaceDetector, t1: Image, astronaut: Image
) -> None:
    (source_faces,) = detector.process([astronaut])
    embedding = engine.recognizer.embed(astronaut, source_faces[0])
    source = engine.prepare_embedding(embedding)
    their_source = InsightFace(embedding=embedding)
    their_latent = their_source.normed_embedding.reshape(1, -1) @ theirs.emap
    their_latent /= np.linalg.norm(their_latent)
    np.testing.assert_allclose(source.data, their_latent[0], atol=1e-6)
    np.testing.assert_array_equal(engine.emap, theirs.emap)

    (faces,) = detector.process([t1])
    aligned = align_faces([t1], [faces], engine.align)
    swapped = engine.process([SwapItem(a.crop, source) for a in aligned])
    for face, ours in zip(aligned, swapped, strict=True):
        crop, matrix = face_align.norm_crop2(t1, face.face.landmarks, 128)
        np.testing.assert_allclose(face.matrix, matrix, atol=1e-4)  # templates differ in the 8th digit
        assert np.abs(face.crop.astype(int) - crop.astype(int)).max() <= 1  # same warp, rounding aside
        their_swap, _ = theirs.get(t1, InsightFace(kps=face.face.landmarks), their_source, paste_back=False)
        assert np.abs(ours.astype(int) - their_swap.astype(int)).max() <= 1
    assert len(swapped) == 6


def test_identity_prepared_for_another_model_is_refused(engine: InswapperEngine, astronaut: Image) -> None:
    from app.pipeline.swap import PreparedSource

    other = PreparedSource("inswapper", "inswapper:other.onnx:1", np.zeros(512, np.float32))
    with pytest.raises(ValueError, match="prepare it again"):
        engine.process([SwapItem(astronaut[:128, :128].copy(), other)])
