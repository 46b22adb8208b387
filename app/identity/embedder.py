"""Who a face is: the embedders identity maps match faces with (`app.pipeline.identity_map`).

The ArcFace recognizer (512-d) when its weights are in the model store; otherwise dlib's 128-d ResNet embedder
from `face_recognition_models` (CC0) with dlib's 5-point shape predictor (CC0, trained on dlib's own 5-point
set) to align the face: both ship in packages, so "swap only me" works without any download. The 68-point
predictor (non-commercial training data) is never used here.

Every embedding is L2-normalised and compared by cosine similarity; each embedder brings the threshold at
which two faces are taken for the same person (`same_person`).
"""

from __future__ import annotations

import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import numpy as np

from app.errors import ModelError, UserError
from app.identity import dlib_worker
from app.identity.dlib_models import embed_faces, load_embedder_models
from app.identity.store import Prepare
from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.face_choice import choose_face, enrolled_choice
from app.pipeline.identity_map import FaceEmbedder, mean_embedding
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.swap import InswapperEngine, PreparedSource, SwapEngine
from app.pipeline.types import Face, Image
from app.settings import PipelineSettings
from engines.store import ModelStore

log = logging.getLogger(__name__)

# dlib's published same-person threshold is 0.6 in euclidean distance between its raw vectors, whose length is
# about 1.46 on faces: 0.6 / 1.46 = 0.41 between unit vectors, 1 - 0.41**2 / 2 = 0.92 in cosine similarity.
# Measured on the sample photos (the six people of insightface's t1, the astronaut, Tom Hanks): different people
# 0.80-0.906 (raw distance 0.63-0.89), the same photo scaled by 0.6 and 1.3 and recompressed 0.98-0.999.
DLIB_SAME_PERSON = 0.92
# ArcFace w600k_r50: insightface's verification threshold region (different people rarely above 0.3).
ARCFACE_SAME_PERSON = 0.4


class EmbedderUnavailable(UserError):
    """No embedder can run here; the message says what to install."""


def _normalised(vector: np.ndarray) -> np.ndarray:
    flat = np.asarray(vector, np.float32).reshape(-1)
    return (flat / max(float(np.linalg.norm(flat)), 1e-12)).astype(np.float32)


class DlibEmbedder:
    """dlib's 128-d ResNet on the face given by its box (dlib's 5 points align it). About 0.1 s per face on one
    core: run once per new face track, never per frame. dlib's objects are not thread-safe: one call at a time.
    dlib keeps Python's GIL while it computes: the server runs it in a process of its own (`DlibProcessEmbedder`)."""

    name = "dlib-resnet-128"
    same_person = DLIB_SAME_PERSON

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._models = load_embedder_models(EmbedderUnavailable)

    @property
    def key(self) -> str:
        return self.name

    def embed(self, image: Image, faces: list[Face]) -> list[np.ndarray]:
        if not faces:
            return []
        with self._lock:
            vectors = self._vectors(image, _boxes(faces))
        return [_normalised(v) for v in vectors]

    def _vectors(self, image: Image, boxes: list[tuple[int, int, int, int]]) -> list[np.ndarray]:
        return embed_faces(self._models, image, boxes)

    def close(self) -> None:
        pass


class DlibProcessEmbedder(DlibEmbedder):
    """`DlibEmbedder` in a worker process (`app.identity.dlib_worker`): the same embeddings, computed without
    holding this process's GIL, so a server's frames keep flowing while a face is embedded (in a thread, dlib
    would stall every thread for ~0.1 s a face). One call at a time. A worker that died (killed, out of memory)
    is started again, logged with how it ended and told to `on_restart`; the call it took down raises, and the
    faces it was embedding stay pending (covered) until a later call embeds them."""

    def __init__(self, on_restart: Callable[[str], None] | None = None) -> None:  # models load in the worker
        self._lock = threading.Lock()
        self._on_restart = on_restart
        self._pool, self._worker = self._start()

    @staticmethod
    def _start() -> tuple[ProcessPoolExecutor, multiprocessing.process.BaseProcess | None]:
        # spawn: forking a process that runs model and network threads could copy a lock held by one of them.
        pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=dlib_worker.start)
        try:
            error = pool.submit(dlib_worker.ready).result()
        except BrokenProcessPool:
            error = "the dlib worker process did not start"
        if error is not None:
            pool.shutdown(wait=False, cancel_futures=True)
            raise EmbedderUnavailable(error)
        # The executor keeps its process in a private table; it is read only to say how the worker ended.
        workers = list(getattr(pool, "_processes", {}).values())
        return pool, workers[0] if len(workers) == 1 else None

    def _vectors(self, image: Image, boxes: list[tuple[int, int, int, int]]) -> list[np.ndarray]:
        try:
            return self._pool.submit(dlib_worker.embed, image, boxes).result()
        except BrokenProcessPool:
            why = _how_it_ended(self._worker)
            log.warning("the dlib worker process %s: starting it again", why)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool, self._worker = self._start()
            if self._on_restart is not None:
                self._on_restart(why)
            raise

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _how_it_ended(worker: multiprocessing.process.BaseProcess | None) -> str:
    code = worker.exitcode if worker is not None else None
    if worker is not None and code is None:
        worker.join(1.0)
        code = worker.exitcode
    if code is None:
        return "ended unexpectedly"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _boxes(faces: list[Face]) -> list[tuple[int, int, int, int]]:
    boxes = []
    for face in faces:
        x1, y1, x2, y2 = (round(float(v)) for v in face.box)
        boxes.append((x1, y1, x2, y2))
    return boxes


class ArcFaceEmbedder:
    """The ArcFace recognizer the inswapper engine uses (or one loaded for matching alone)."""

    name = "arcface"
    same_person = ARCFACE_SAME_PERSON

    def __init__(self, recognizer: ArcFaceRecognizer, model_name: str, *, owned: bool = False) -> None:
        self._recognizer = recognizer
        self._model_name = model_name
        self._owned = owned

    @property
    def key(self) -> str:
        return f"arcface:{self._model_name}"

    def embed(self, image: Image, faces: list[Face]) -> list[np.ndarray]:
        if not faces:
            return []
        crops = [self._recognizer.crop(image, face) for face in faces]
        return [_normalised(v) for v in self._recognizer.process(crops)]

    def close(self) -> None:
        if self._owned:
            self._recognizer.close()


def build_embedder(
    engine: SwapEngine,
    settings: PipelineSettings,
    store: ModelStore,
    *,
    own_process: bool = False,
    on_restart: Callable[[str], None] | None = None,
) -> FaceEmbedder:
    """The inswapper engine's own recognizer; else the ArcFace recognizer when its weights are in the store;
    else dlib's embedder (`EmbedderUnavailable` when dlib is not installed either), in a worker process of its
    own with `own_process` (a server: see `DlibProcessEmbedder`, which tells `on_restart` why it restarted it)."""
    inner: object = engine
    while (wrapped := getattr(inner, "inner", None)) is not None:  # wrappers (the mouth mask)
        inner = wrapped
    if isinstance(inner, InswapperEngine):
        return ArcFaceEmbedder(inner.recognizer, settings.recognizer_model)
    try:
        present = store.status(settings.recognizer_model) == "verified"
    except ModelError:  # an unknown model name
        present = False
    if present:
        from app.pipeline.factory import load_model  # the model loader, only when the weights are there

        recognizer = ArcFaceRecognizer(load_model(store, settings.recognizer_model, settings))
        return ArcFaceEmbedder(recognizer, settings.recognizer_model, owned=True)
    return DlibProcessEmbedder(on_restart) if own_process else DlibEmbedder()


REFERENCE = "reference"  # the engine name reference embeddings are stored under


def reference_preparer(detector: RetinaFaceDetector, embedder: FaceEmbedder) -> Prepare:
    """How an identity becomes a person's reference for identity maps: the normalised mean embedding of the
    enrolled face of every photo (stored beside the engine's preparation, keyed by the embedder)."""

    def prepare(images: list[Image], face_index: int | None) -> PreparedSource:
        embeddings = []
        for image in images:
            (faces,) = detector.process([image])
            face = choose_face(faces, enrolled_choice(face_index))
            embeddings.extend(embedder.embed(image, [face]))
        return PreparedSource(REFERENCE, embedder.key, mean_embedding(embeddings))

    return prepare
