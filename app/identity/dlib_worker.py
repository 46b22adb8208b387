"""The worker process of `app.identity.embedder.DlibProcessEmbedder`: dlib's embedder loaded and run there.

Imports only dlib, numpy and `app.identity.dlib_models`, so the process starts in about a second.
"""

import numpy as np

from app.errors import UserError
from app.identity.dlib_models import DlibModels, embed_faces, load_embedder_models
from app.pipeline.types import Image

_models: DlibModels | None = None
_error: str | None = None


def start() -> None:
    """The process's initializer: load the models once (what is missing is kept for `ready`)."""
    global _models, _error
    try:
        _models = load_embedder_models()
    except UserError as exc:
        _error = str(exc)


def ready() -> str | None:
    """None once the models are loaded, else why they are not (the install hint)."""
    return _error


def embed(image: Image, boxes: list[tuple[int, int, int, int]]) -> list[np.ndarray]:
    if _models is None:
        raise RuntimeError(_error or "the dlib worker has not started")
    return embed_faces(_models, image, boxes)
