"""Fixtures of the benchmark tests."""

import pytest

from engines.errors import ModelError
from engines.store import ModelStore


@pytest.fixture
def hand_model(store: ModelStore) -> None:
    """The lite hand model in the store (the occlusion rows need it); the test is skipped where it cannot be
    imported."""
    try:
        store.ensure("hand_landmark_lite")
    except ModelError as exc:
        pytest.skip(f"the hand model cannot be imported here: {exc}")
