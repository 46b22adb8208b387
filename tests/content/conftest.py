"""Fixtures for the content gate tests: the stand-in classifier the tests build."""

from pathlib import Path

import pytest

from tests.content.marker import build_marker_model


@pytest.fixture(scope="session")
def marker_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_marker_model(tmp_path_factory.mktemp("content") / "marker.onnx")
