"""A model served by NVIDIA Triton Inference Server, over its gRPC client: the runtime `Model` interface, so
pipeline stages run the same whether a model is in this process or on the shared model tier.

Triton's dynamic batcher groups the calls of every media process that shares the server (see
`swapcast triton export` for the batching settings); a batch larger than the model's `max_batch_size` is
sent in chunks. Errors say whether the server is down or the model is not loaded, and how to fix it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from app.errors import ModelError
from app.runtime.model import Array, BatchSplitter

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 10.0


def _client_module() -> Any:
    try:
        import tritonclient.grpc as grpcclient
    except ImportError as exc:
        raise ModelError(f"the Triton backend needs tritonclient ({exc}): pip install 'swapcast[triton]'") from None
    return grpcclient


class TritonModel:
    """One model on a Triton server. `path` is the local file it was exported from (for messages and for the
    model name: the file's stem, as `swapcast triton export` names it)."""

    def __init__(self, url: str, path: Path, *, name: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self._grpc = _client_module()
        from tritonclient.utils import InferenceServerException

        self._error = InferenceServerException
        self.url = url
        self.path = Path(path)
        self.name = name or self.path.name.split(".", 1)[0]
        self.timeout_s = timeout_s
        self._client = self._grpc.InferenceServerClient(url)
        self._lock = threading.Lock()  # the client's channel is thread-safe; this guards close()
        try:
            ready = self._client.is_server_ready(client_timeout=timeout_s)
        except self._error as exc:
            self._client.close()
            raise ModelError(f"Triton at {url} is not reachable ({_short(exc)}): is the server running?") from None
        if not ready:
            self._client.close()
            raise ModelError(f"Triton at {url} is up but not ready: see its log")
        if not self._client.is_model_ready(self.name, client_timeout=timeout_s):
            self._client.close()
            raise ModelError(
                f"model {self.name} is not loaded on Triton at {url}: export it with "
                f"`swapcast triton export --out REPOSITORY` and (re)start or reload the server"
            )
        config = self._client.get_model_config(self.name, as_json=True, client_timeout=timeout_s)["config"]
        self.max_batch_size = int(config.get("max_batch_size", 0))
        self._types = {t["name"]: t["data_type"].removeprefix("TYPE_") for t in config["input"]}
        self.input_names = [t["name"] for t in config["input"]]
        self.output_names = [t["name"] for t in config["output"]]
        dims = [int(d) for d in config["input"][0]["dims"]]
        if self.max_batch_size > 0:
            self.input_shape: list[int | str | None] = ["batch", *[d if d > 0 else None for d in dims]]
        else:
            self.input_shape = [d if d > 0 else None for d in dims]
        self.fixed_batch = self.max_batch_size == 0 and bool(dims) and dims[0] == 1
        limit = self.max_batch_size if self.max_batch_size > 0 else (1 if self.fixed_batch else None)
        self._split = BatchSplitter(f"{self.name} on Triton", limit, self._infer)

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[Array]:
        """Run a batch (the first axis of every input), in slices the model accepts."""
        return self._split(feeds)

    def _infer(self, feeds: Mapping[str, np.ndarray]) -> list[Array]:
        inputs = []
        for name in self.input_names:
            value = np.ascontiguousarray(feeds[name])
            tensor = self._grpc.InferInput(name, list(value.shape), self._types[name])
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        outputs = [self._grpc.InferRequestedOutput(name) for name in self.output_names]
        try:
            result = self._client.infer(self.name, inputs, outputs=outputs, client_timeout=self.timeout_s)
        except self._error as exc:
            raise ModelError(f"Triton at {self.url} failed to run {self.name}: {_short(exc)}") from None
        return [np.asarray(result.as_numpy(name)) for name in self.output_names]

    def close(self) -> None:
        with self._lock:
            self._client.close()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
