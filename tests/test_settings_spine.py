"""Every SWAPCAST_ setting is read through the settings classes; the `auto` swap engine is resolved against the
model store it is given; the one face-choice rule serves uploads, stored identities and files alike."""

from pathlib import Path

import numpy as np
import pytest

from app.cli import build_parser
from app.commands.serve import build_settings
from app.model_store import open_model_store, resolve_swap_engine
from app.names import BACKENDS, PRECISIONS, SWAP_ENGINE_CHOICES, SWAP_ENGINES
from app.pipeline.face_choice import FaceChoiceError, choose_face, enrolled_choice
from app.pipeline.types import Face
from app.runtime.onnx import default_threads
from app.settings import ModelStoreSettings, PipelineSettings
from engines.registry import get_entry
from engines.store import ModelStore


def test_names_are_defined_once_and_reused() -> None:
    assert SWAP_ENGINES == ("inswapper", "mesh", "classic", "passthrough")
    assert ("auto", *SWAP_ENGINES) == SWAP_ENGINE_CHOICES
    assert BACKENDS == ("auto", "onnxruntime", "tensorrt", "torch", "triton")
    assert PRECISIONS == ("fp32", "fp16", "int8")


def test_model_dir_comes_from_the_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPCAST_MODEL_DIR", str(tmp_path / "models"))
    assert ModelStoreSettings().model_dir == tmp_path / "models"
    assert open_model_store().root == tmp_path / "models"
    monkeypatch.delenv("SWAPCAST_MODEL_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert open_model_store().root == tmp_path / "cache" / "swapcast" / "models"


def test_threads_come_from_the_settings_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPCAST_THREADS", "3")
    assert PipelineSettings().threads == 3
    assert default_threads() >= 1  # the runtime no longer reads the environment itself
    monkeypatch.setenv("SWAPCAST_THREADS", "0")
    with pytest.raises(ValueError, match="threads"):
        PipelineSettings()


def test_auto_engine_is_inswapper_only_when_its_files_are_present(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    settings = PipelineSettings(engine="auto")
    assert resolve_swap_engine(settings, store) == "mesh"  # no swap weights; the landmark model is importable
    for name in (settings.swapper_model, settings.recognizer_model):
        (tmp_path / get_entry(name).file).write_bytes(b"weights")
    assert resolve_swap_engine(settings, store) == "inswapper"
    assert resolve_swap_engine(settings.model_copy(update={"engine": "passthrough"}), store) == "passthrough"
    assert resolve_swap_engine(settings.model_copy(update={"swapper_model": "no_such_model"}), store) == "mesh"


def test_auto_engine_is_classic_without_swap_weights_or_landmark_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib.util

    real_find_spec = importlib.util.find_spec
    # The landmark converter not installed here, and the landmark model not imported.
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "tflite2onnx" else real_find_spec(name)
    )
    store = ModelStore(tmp_path)
    assert resolve_swap_engine(PipelineSettings(engine="auto"), store) == "classic"
    assert resolve_swap_engine(PipelineSettings(engine="auto", landmark_model="no_such_model"), store) == "classic"


def _serve_settings(argv: list[str]) -> str:
    args = build_parser().parse_args(["serve", *argv])
    return build_settings(args).pipeline.engine


def test_serve_runs_auto_unless_the_engine_is_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWAPCAST_MODEL_DIR", str(tmp_path))
    monkeypatch.delenv("SWAPCAST_ENGINE", raising=False)
    assert _serve_settings([]) == "mesh"  # auto, and no swap weights in this directory
    for name in ("inswapper_128", "arcface_w600k_r50"):
        (tmp_path / get_entry(name).file).write_bytes(b"weights")
    assert _serve_settings([]) == "inswapper"
    monkeypatch.setenv("SWAPCAST_ENGINE", "passthrough")
    assert _serve_settings([]) == "passthrough"
    assert _serve_settings(["--engine", "classic"]) == "classic"


def test_serve_refuses_an_unknown_engine_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from app.errors import UserError

    monkeypatch.setenv("SWAPCAST_ENGINE", "deepfake9000")
    with pytest.raises(UserError, match="invalid setting engine: Input should be .auto., .inswapper."):
        build_settings(build_parser().parse_args(["serve"]))


def _face(x: float, size: float, score: float) -> Face:
    box = np.array([x, 0.0, x + size, size], np.float32)
    return Face(box=box, landmarks=np.zeros((5, 2), np.float32), score=score)


def test_one_face_choice_rule() -> None:
    big, small = _face(0, 100, 0.8), _face(200, 40, 0.9)
    faces = [small, big]  # by detector score
    assert choose_face(faces, "largest") is big
    assert choose_face(faces, 1) is big
    assert choose_face([small], "only") is small
    with pytest.raises(FaceChoiceError, match="found 2 faces; choose one with face_index 0..1"):
        choose_face(faces, "only")
    with pytest.raises(FaceChoiceError, match="face_index 2 does not exist"):
        choose_face(faces, 2)
    with pytest.raises(FaceChoiceError, match="no face found"):
        choose_face([], "largest")


def test_a_stored_identity_is_prepared_again_with_the_choice_it_was_enrolled_with() -> None:
    assert enrolled_choice(None) == "only"  # never silently the largest of several
    assert enrolled_choice(2) == 2
