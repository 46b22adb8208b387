"""Fixtures for the supply-chain tests: models made on demand in the session's model directory."""

from collections.abc import Callable
from pathlib import Path

import pytest

from engines.errors import ModelError
from engines.store import ModelStore


@pytest.fixture(scope="session")
def model(store: ModelStore) -> Callable[[str], Path]:
    """`model(name)`: the model's file, imported or built if needed; the test is skipped with the reason
    when this machine cannot make it (e.g. the package that ships its weights is not installed)."""

    def get(name: str) -> Path:
        try:
            return store.ensure(name)
        except ModelError as exc:
            pytest.skip(f"{name} cannot be made here: {exc}")

    return get
