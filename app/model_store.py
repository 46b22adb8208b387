"""The model store the app reads models from: built once from settings by whoever starts the work (a CLI
command, the server) and passed down; and the choice the `auto` swap engine makes from what it holds."""

import importlib.util

from app.errors import ModelError
from app.names import SwapEngineName
from app.settings import ModelStoreSettings, PipelineSettings
from engines.store import ModelStore


def open_model_store(settings: ModelStoreSettings | None = None) -> ModelStore:
    """The store at `SWAPCAST_MODEL_DIR` (or the user's cache directory)."""
    return ModelStore((settings or ModelStoreSettings()).model_dir)


def resolve_swap_engine(settings: PipelineSettings, store: ModelStore) -> SwapEngineName:
    """The swap engine to run: as configured, or for `auto` inswapper when its swapper and recognizer files are
    in the store, else mesh when its landmark model is imported or importable here, else classic (no model)."""
    if settings.engine != "auto":
        return settings.engine
    try:
        present = all(store.file_path(name).is_file() for name in (settings.swapper_model, settings.recognizer_model))
    except ModelError:  # an unknown model name: not present
        present = False
    if present:
        return "inswapper"
    return "mesh" if mesh_available(settings, store) else "classic"


def mesh_available(settings: PipelineSettings, store: ModelStore) -> bool:
    """Whether the mesh engine's landmark model is imported, or its converter is installed to import it."""
    try:
        if store.status(settings.landmark_model) == "verified":
            return True
    except ModelError:  # an unknown model name
        return False
    return importlib.util.find_spec("tflite2onnx") is not None


HAND_MODELS = ("hand_landmark_lite", "hand_landmark")


def hand_model_in_store(settings: PipelineSettings, store: ModelStore) -> str | None:
    """The hand model SWAPCAST_OCCLUSION=auto runs: `settings.hand_model` where it is verified in the store, else
    the other hand model where that one is (a store that has only one of them keeps hands in front), else None."""
    for name in (settings.hand_model, *(n for n in HAND_MODELS if n != settings.hand_model)):
        if store.status(name) == "verified":
            return name
    return None
