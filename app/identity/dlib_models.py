"""dlib and the models `face_recognition_models` ships (CC0): its 128-d ResNet embedder and a shape predictor.

One loader for everything that uses them: identity maps' embedder (5-point predictor) and the quality benchmark's
measurer (68-point predictor, benchmarks only). Kept free of heavy imports, so a worker process can load it alone.
"""

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import UserError

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


def _models_dir() -> Path | None:
    # Found without importing the package: its __init__ needs pkg_resources.
    try:
        spec = importlib.util.find_spec("face_recognition_models")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "models"
