"""dlib and the models `face_recognition_models` ships (CC0): its 128-d ResNet embedder and a shape predictor.

One loader for everything that uses them: identity maps' embedder (5-point predictor) and the quality benchmark's
measurer (68-point predictor, benchmarks only). Kept free of heavy imports, so a worker process can load it alone
(`app.identity.dlib_worker`).
"""

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import UserError
from app.pipeline.types import Image

_INSTALL = "pip install dlib-bin==20.0.1.post1 face_recognition_models==0.3.0"
SHAPE_5 = "shape_predictor_5_face_landmarks.dat"
SHAPE_68 = "shape_predictor_68_face_landmarks.dat"
RESNET = "dlib_face_recognition_resnet_model_v1.dat"


@dataclass(frozen=True)
class DlibModels:
    dlib: Any  # the module (untyped)
    shape: Any  # dlib.shape_predictor
    net: Any  # dlib.face_recognition_model_v1


def load_dlib_models(shape_file: str, need: str, extra: str, error: type[UserError] = UserError) -> DlibModels:
    """dlib with the shape predictor `shape_file` and the ResNet embedder. Where dlib or the models are missing:
    `error` saying what `need`s them and how to install them (`extra`: the swapcast extra that brings them)."""
    hint = f"{_INSTALL} (the {extra} extra)"
    try:
        import dlib
    except ImportError:
        raise error(f"{need} needs dlib: {hint}") from None
    models = _models_dir()
    if models is None:
        raise error(f"{need} needs face_recognition_models: {hint}")
    return DlibModels(
        dlib, dlib.shape_predictor(str(models / shape_file)), dlib.face_recognition_model_v1(str(models / RESNET))
    )


def load_embedder_models(error: type[UserError] = UserError) -> DlibModels:
    """What identity maps' dlib embedder needs: the ResNet and the 5-point predictor (CC0, dlib's own data)."""
    return load_dlib_models(SHAPE_5, "matching faces without ArcFace weights", "`match`", error)


def embed_faces(models: DlibModels, image: Image, boxes: list[tuple[int, int, int, int]]) -> list[np.ndarray]:
    """The raw 128-d embeddings of the faces at `boxes` (x1, y1, x2, y2) of a BGR image, each aligned by the shape
    predictor. dlib keeps Python's GIL all the while (~0.1 s a face)."""
    rgb = np.ascontiguousarray(image[..., ::-1])
    shapes = models.dlib.full_object_detections()
    for box in boxes:
        shapes.append(models.shape(rgb, models.dlib.rectangle(*box)))
    return [np.array(v) for v in models.net.compute_face_descriptor(rgb, shapes)]


def _models_dir() -> Path | None:
    # Found without importing the package: its __init__ needs pkg_resources.
    try:
        spec = importlib.util.find_spec("face_recognition_models")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models"
