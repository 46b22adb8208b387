"""Where model files live: `SWAPCAST_MODEL_DIR`, else the user's cache."""

import os
from pathlib import Path


def model_dir() -> Path:
    configured = os.environ.get("SWAPCAST_MODEL_DIR")
    if configured:
        return Path(configured).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "swapcast" / "models"
