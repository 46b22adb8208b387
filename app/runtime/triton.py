"""A model served by NVIDIA Triton Inference Server, over its gRPC client: the runtime `Model` interface, so
pipeline stages run the same whether a model is in this process or on the shared model tier.

Triton's dynamic batcher groups the calls of every media process that shares the server (see
`swapcast triton export` for the batching settings); a batch larger than the model's `max_batch_size` is
sent in chunks. Errors say whether the server is down or the model is not loaded, and how to fix it.

With the server on the same host (a loopback URL, or `shared_memory="on"`), tensors travel through system
shared memory (app.runtime.triton_shm) and only their descriptions over gRPC.
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
from app.runtime.triton_shm import SharedMemoryMode, SharedMemoryRegions, aligned, is_loopback

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

    def __init__(
        self,
        url: str,
        path: Path,
        *,
        name: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        shared_memory: SharedMemoryMode = "auto",
    ) -> None:
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
        self._output_dims = {t["name"]: [int(d) for d in t["dims"]] for t in config["output"]}
        self._output_types = {t["name"]: t["data_type"].removeprefix("TYPE_") for t in config["output"]}
        dims = [int(d) for d in config["input"][0]["dims"]]
        if self.max_batch_size > 0:
            self.input_shape: list[int | str | None] = ["batch", *[d if d > 0 else None for d in dims]]
        else:
            self.input_shape = [d if d > 0 else None for d in dims]
        self.fixed_batch = self.max_batch_size == 0 and bool(dims) and dims[0] == 1
        limit = self.max_batch_size if self.max_batch_size > 0 else (1 if self.fixed_batch else None)
        self._split = BatchSplitter(f"{self.name} on Triton", limit, self._infer)
        self._shm = self._shared_memory(shared_memory)

    @property
    def uses_shared_memory(self) -> bool:
        return self._shm is not None

    def _shared_memory(self, mode: SharedMemoryMode) -> SharedMemoryRegions | None:
        """Regions for this model's calls when the server shares this host; `auto` falls back to plain gRPC
        where the server cannot open them, `on` makes that an error."""
        if mode == "off" or (mode == "auto" and not is_loopback(self.url)):
            return None
        regions = SharedMemoryRegions(self._client, self.name)
        try:
            regions.probe()
        except Exception as exc:
            if mode == "on":
                self._client.close()
                raise ModelError(
                    f"Triton at {self.url} cannot use this host's shared memory ({_short(exc)}): run it on this "
                    f"host with access to /dev/shm, or set SWAPCAST_TRITON_SHM=off"
                ) from None
            log.info("Triton at %s: no shared memory (%s), tensors go over gRPC", self.url, _short(exc))
            return None
        return regions

    def run(self, feeds: Mapping[str, np.ndarray]) -> list[Array]:
        """Run a batch (the first axis of every input), in slices the model accepts. `ModelError` when Triton
        cannot run it (the server away, its shared memory unregistered, the model unloaded)."""
        try:
            return self._split(feeds)
        except self._error as exc:
            raise ModelError(f"Triton at {self.url} failed to run {self.name}: {_short(exc)}") from None

    def _infer(self, feeds: Mapping[str, np.ndarray]) -> list[Array]:
        values = [np.ascontiguousarray(feeds[name]) for name in self.input_names]
        inputs = [
            self._grpc.InferInput(name, list(value.shape), self._types[name])
            for name, value in zip(self.input_names, values, strict=True)
        ]
        outputs = [self._grpc.InferRequestedOutput(name) for name in self.output_names]
        if self._shm is None:
            for tensor, value in zip(inputs, values, strict=True):
                tensor.set_data_from_numpy(value)
            return self._outputs(self._call(inputs, outputs), None, {})
        return self._infer_shared(values, inputs, outputs)

    def _infer_shared(self, values: list[np.ndarray], inputs: list[Any], outputs: list[Any]) -> list[Array]:
        """Inputs, and outputs whose size the config fixes, in one leased region at aligned offsets."""
        assert self._shm is not None
        from tritonclient.utils import triton_to_np_dtype

        batch = int(values[0].shape[0]) if self.max_batch_size > 0 else None
        offsets, end = [], 0
        for value in values:
            offsets.append(end)
            end += aligned(value.nbytes)
        out_offsets: dict[str, tuple[int, int]] = {}
        for name in self.output_names:
            dims = self._output_dims[name]
            if any(d < 0 for d in dims):
                continue  # a size only the run knows: this output comes back over gRPC
            count = int(np.prod([batch, *dims] if batch is not None else dims))
            size = count * np.dtype(triton_to_np_dtype(self._output_types[name])).itemsize
            out_offsets[name] = (end, size)
            end += aligned(size)
        with self._shm.lease(end) as region:
            self._shm.write(region, values, offsets)
            for tensor, value, offset in zip(inputs, values, offsets, strict=True):
                tensor.set_shared_memory(region.name, value.nbytes, offset)
            for tensor, name in zip(outputs, self.output_names, strict=True):
                if name in out_offsets:
                    offset, size = out_offsets[name]
                    tensor.set_shared_memory(region.name, size, offset)
            result = self._call(inputs, outputs)
            return self._outputs(result, region, out_offsets)

    def _call(self, inputs: list[Any], outputs: list[Any]) -> Any:
        try:
            return self._client.infer(self.name, inputs, outputs=outputs, client_timeout=self.timeout_s)
        except self._error as exc:
            raise ModelError(f"Triton at {self.url} failed to run {self.name}: {_short(exc)}") from None

    def _outputs(self, result: Any, region: Any, out_offsets: dict[str, tuple[int, int]]) -> list[Array]:
        from tritonclient.utils import triton_to_np_dtype

        arrays: list[Array] = []
        for name in self.output_names:
            if name not in out_offsets:
                arrays.append(np.asarray(result.as_numpy(name)))
                continue
            described = result.get_output(name)
            shape = [int(d) for d in described.shape]
            assert self._shm is not None
            arrays.append(self._shm.read(region, triton_to_np_dtype(described.datatype), shape, out_offsets[name][0]))
        return arrays

    def close(self) -> None:
        with self._lock:
            if self._shm is not None:
                self._shm.close()
            self._client.close()


def triton_problem(url: str, timeout_s: float = 1.0) -> str | None:
    """None when the Triton server at `url` answers ready (every model loaded), else why not. Blocking."""
    grpc = _client_module()
    from tritonclient.utils import InferenceServerException

    client = grpc.InferenceServerClient(url)
    try:
        if client.is_server_ready(client_timeout=timeout_s):
            return None
        return f"Triton at {url} is up but not ready"
    except InferenceServerException as exc:
        return f"Triton at {url} is not reachable ({_short(exc)})"
    finally:
        client.close()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
