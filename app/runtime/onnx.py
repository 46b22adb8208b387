"""ONNX Runtime behind the small interface every model backend offers (`app.runtime.model.Model`)."""

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from app.errors import ModelError
from app.runtime.model import Array, BatchSplitter, Feeds

log = logging.getLogger(__name__)

# Preferred order when several are installed; CPU is always last and always available.
_PROVIDER_ORDER = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")


def available_providers(requested: Sequence[str] | None = None) -> list[str]:
    installed = set(ort.get_available_providers())
    wanted = list(requested) if requested else list(_PROVIDER_ORDER)
    chosen = [p for p in wanted if p in installed]
    if "CPUExecutionProvider" not in chosen:
        chosen.append("CPUExecutionProvider")
    return chosen


def default_threads() -> int:
    """All cores; SWAPCAST_THREADS reaches models through PipelineSettings.threads."""
    return os.cpu_count() or 1


class OnnxModel:
    """One ONNX Runtime session. `run` takes a whole batch; graphs with a fixed batch of 1 are run item by
    item (said once in the log), so callers never need to know."""

    def __init__(
        self,
        path: Path,
        *,
        threads: int | None = None,
        providers: Sequence[str] | None = None,
    ) -> None:
        self.path = Path(path)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads or default_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        # Idle worker threads sleep instead of spinning: the video codecs, paste-back and other sessions
        # share these cores (measured on 2 busy cores: detector p50 37 ms without spinning, 45 ms with).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session: ort.InferenceSession | None = ort.InferenceSession(
                str(self.path), sess_options=options, providers=available_providers(providers)
            )
        except Exception as exc:  # ORT raises several unrelated types for unreadable graphs
            raise ModelError(f"cannot load model {self.path}: {exc}") from exc
        session = self.session
        self.input_names = [i.name for i in session.get_inputs()]
        self.output_names = [o.name for o in session.get_outputs()]
        first = session.get_inputs()[0].shape
        self.input_shape: list[int | str | None] = list(first)
        self.fixed_batch = isinstance(first[0], int) and first[0] == 1
        self._split = BatchSplitter(self.path.name, 1 if self.fixed_batch else None, self._run_batch)

    @property
    def session(self) -> ort.InferenceSession:
        if self._session is None:
            raise ModelError(f"model {self.path.name} is closed")
        return self._session

    @property
    def providers(self) -> list[str]:
        return list(self.session.get_providers())

    def run(self, feeds: Feeds) -> list[Array]:
        """Run a batch (the first axis of every input)."""
        return self._split(feeds)

    def _run_batch(self, feeds: Feeds) -> list[Array]:
        return [np.asarray(o) for o in self.session.run(self.output_names, dict(feeds))]

    def close(self) -> None:
        """Drop the session (its memory goes with it). Idempotent."""
        self._session = None
