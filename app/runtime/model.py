"""The contract every model backend keeps (ONNX Runtime, PyTorch, TensorRT), and the one way a backend
runs a batch larger than its graph takes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

import numpy as np
import numpy.typing as npt

log = logging.getLogger(__name__)

Array = npt.NDArray[np.float32]
Feeds = Mapping[str, np.ndarray]


class Model(Protocol):
    """What the pipeline stages use of a loaded model, whatever runs it."""

    path: Path
    input_names: list[str]
    output_names: list[str]
    input_shape: list[int | str | None]
    fixed_batch: bool

    def run(self, feeds: Feeds) -> list[Array]:
        """Run a batch (the first axis of every input), of any size."""
        ...

    def close(self) -> None:
        """Release sessions, contexts and device buffers. Idempotent; a closed model is not run again."""
        ...


class BatchSplitter:
    """Runs a batch through a graph that takes at most `limit` items per call (1 for a fixed-batch graph,
    an engine's profile maximum for TensorRT): in slices of `limit`, outputs joined in order, said once in
    the log. `limit=None` means any batch size runs in one call."""

    def __init__(self, name: str, limit: int | None, run: Callable[[Feeds], list[Array]]) -> None:
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.name = name
        self.limit = limit
        self._run = run
        self._said = False

    def __call__(self, feeds: Feeds) -> list[Array]:
        batch = next(iter(feeds.values())).shape[0]
        if self.limit is None or batch <= self.limit:
            return self._run(feeds)
        if not self._said:
            if self.limit == 1:
                log.info("%s has a fixed batch of 1: running %d items one by one", self.name, batch)
            else:
                log.info("%s takes at most %d items per call: running %d in slices", self.name, self.limit, batch)
            self._said = True
        step = self.limit
        parts = [self._run({k: v[i : i + step] for k, v in feeds.items()}) for i in range(0, batch, step)]
        return [np.concatenate([p[j] for p in parts], axis=0) for j in range(len(parts[0]))]
