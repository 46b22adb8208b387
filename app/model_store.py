"""The model store the app reads models from: built once from settings by whoever starts the work (a CLI
command, the server) and passed down; and the choice the `auto` swap engine makes from what it holds."""

from app.errors import ModelError
from app.names import SwapEngineName
from app.settings import ModelStoreSettings, PipelineSettings
from engines.store import ModelStore


def open_model_store(settings: ModelStoreSettings | None = None) -> ModelStore:
    """The store at `SWAPCAST_MODEL_DIR` (or the user's cache directory)."""
    return ModelStore((settings or ModelStoreSettings()).model_dir)


def resolve_swap_engine(settings: PipelineSettings, store: ModelStore) -> SwapEngineName:
    """The swap engine to run: as configured, or for `auto` inswapper when its swapper and recognizer files are
    in the store, else classic (no weights needed)."""
    if settings.engine != "auto":
        return settings.engine
    try:
        present = all(store.file_path(name).is_file() for name in (settings.swapper_model, settings.recognizer_model))
    except ModelError:  # an unknown model name: not present
        present = False
    return "inswapper" if present else "classic"
