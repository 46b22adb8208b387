"""Shared fixtures: a model directory with the models this machine can get, and real face photos."""

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.media.clips import load_sample
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.types import Image
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One model directory for the whole run (imports and reference builds happen once)."""
    root = tmp_path_factory.mktemp("models")
    patcher = pytest.MonkeyPatch()
    patcher.setenv("SWAPCAST_MODEL_DIR", str(root))
    yield root
    patcher.undo()


@pytest.fixture(scope="session")
def store(model_root: Path) -> ModelStore:
    return ModelStore(model_root)


@pytest.fixture(scope="session")
def detector(store: ModelStore) -> RetinaFaceDetector:
    model = OnnxModel(store.ensure("retinaface_mnet025"), threads=2)
    return RetinaFaceDetector(model, DetectorConfig(refine_landmarks=True))


@pytest.fixture(scope="session")
def t1() -> Image:
    return load_sample("t1")


@pytest.fixture(scope="session")
def astronaut() -> Image:
    return load_sample("astronaut")


@pytest.fixture(autouse=True)
def mark_registry(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Marks issued by a test are recorded in a directory of its own, not the user's data directory."""
    path = tmp_path_factory.mktemp("marks") / "marks.jsonl"
    monkeypatch.setenv("SWAPCAST_MARK_REGISTRY", str(path))
    return path
