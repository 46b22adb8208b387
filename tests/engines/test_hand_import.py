"""The hand landmark model is imported from the @mediapipe/hands npm package and converted to ONNX."""

import io
import tarfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engines import registry
from engines.errors import ModelError
from engines.importers import hand_landmark
from engines.store import ModelStore, read_local_manifest


@pytest.mark.parametrize("name", ["hand_landmark", "hand_landmark_lite"])
def test_import_gives_a_batch_dynamic_model_with_named_io(
    name: str, model: Callable[[str], Path], store: ModelStore
) -> None:
    path = model(name)
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape) for i in session.get_inputs()] == [("image", ["batch", 3, 224, 224])]
    assert [o.name for o in session.get_outputs()] == ["landmarks", "hand_score", "handedness"]
    batch = np.random.default_rng(0).random((3, 3, 224, 224), dtype=np.float32)
    points, score, side = session.run(None, {"image": batch})
    assert points.shape == (3, 21, 3) and score.shape == (3, 1) and side.shape == (3, 1)
    assert np.all((score >= 0) & (score <= 1)), "the presence score is a probability"
    alone = session.run(None, {"image": batch[1:2]})[0]
    assert np.allclose(alone[0], points[1], atol=1e-3)
    assert store.status(name) == "verified"
    assert read_local_manifest(store.root)[name].size == path.stat().st_size
    assert "Apache-2.0" in registry.get_entry(name).licence


def _tarball(tmp_path: Path, members: dict[str, bytes]) -> Path:
    path = tmp_path / "mediapipe-hands-0.4.1675469240.tgz"
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(f"package/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_a_model_file_of_another_release_is_refused(tmp_path: Path) -> None:
    tarball = _tarball(tmp_path, {hand_landmark.TFLITE_NAME: b"not the pinned model"})
    with pytest.raises(ModelError, match="hand_landmark_full.tflite .* expected 8c02"):
        hand_landmark.import_hand_landmark(tmp_path / "out", tarball)
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_package_without_the_file_is_a_clear_error(tmp_path: Path) -> None:
    tarball = _tarball(tmp_path, {"README.md": b"hands"})
    with pytest.raises(ModelError, match="no readable package/hand_landmark_full.tflite"):
        hand_landmark.import_hand_landmark(tmp_path, tarball)
