"""A TensorRT engine behind the `app.runtime.model.Model` interface, as a context manager.

Construction only reads the engine's JSON manifest and checks it against this GPU, this TensorRT
version and the model the caller expects (`engines.tensorrt.manifest.verify_engine`): an engine built
elsewhere, from another model version, or damaged is refused there, with the reason, before any byte
of it is deserialised. Activation (entering the context, or the first `run`) deserialises the engine
and sets up one execution context, one CUDA stream, device buffers sized for the profile's largest
shapes, and pinned host buffers for asynchronous copies. `close` (leaving the context) frees them.

The stream is non-blocking: a blocking stream synchronises implicitly with the legacy default stream,
which PyTorch and other libraries in the same process use, so mixed backends would wait on each other.
TensorRT takes the stream as an int: `native_handle` (cuda-bindings' helper, `int()` on older ones).
Each run holds `gpu_work` shared, so a CUDA-graph capture of a torch model never overlaps it.

`tensorrt` and the CUDA bindings (cuda-python) are imported on first use, so this module imports on
machines without them.
"""

from __future__ import annotations

import ctypes
import logging
import math
import threading
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np

from app.errors import ModelError
from app.runtime.model import Array, BatchSplitter, Feeds
from app.runtime.torch_graphs import gpu_work
from engines.tensorrt.manifest import (
    EngineManifest,
    Platform,
    check_cuda,
    import_cudart,
    import_tensorrt,
    native_handle,
    probe_platform,
    verify_engine,
)

log = logging.getLogger(__name__)


@dataclass
class _Binding:
    name: str
    dtype: np.dtype[Any]
    device: int  # device pointer
    host: np.ndarray  # pinned host memory, flat, sized for the largest shape
    host_pointer: int
    capacity: int  # elements


class TensorRTModel:
    """One deserialised engine with its execution context. Not for concurrent `run` calls from several
    threads (the batcher runs each model on one worker); a lock makes misuse safe, not fast."""

    def __init__(self, path: Path, *, source_sha256: str | None, platform: Platform | None = None) -> None:
        self.path = Path(path)
        self.platform = platform if platform is not None else probe_platform()
        self.manifest: EngineManifest = verify_engine(self.path, self.platform, source_sha256)
        self.input_names = list(self.manifest.inputs)
        self.output_names = list(self.manifest.outputs)
        first = self.manifest.profiles[self.input_names[0]]
        self.input_shape: list[int | str | None] = [
            low if low == high else ("batch" if axis == 0 else None)
            for axis, (low, high) in enumerate(zip(first.min, first.max, strict=True))
        ]
        self.max_batch = self.manifest.max_batch
        self.fixed_batch = self.max_batch == 1
        self._lock = threading.Lock()
        self._active = False
        self._trt: Any = None
        self._cudart: Any = None
        self._engine: Any = None
        self._context: Any = None
        self._stream: Any = None
        self._stream_handle = 0
        self._bindings: dict[str, _Binding] = {}
        self._split = BatchSplitter(self.path.name, self.max_batch, self._run_locked)

    @property
    def providers(self) -> list[str]:
        return [f"tensorrt:{self.manifest.precision}"]

    # -- activation -------------------------------------------------------------------------------

    def activate(self) -> TensorRTModel:
        """Deserialise the engine and allocate buffers (idempotent)."""
        with self._lock:
            if not self._active:
                self._activate()
        return self

    def __enter__(self) -> TensorRTModel:
        return self.activate()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _activate(self) -> None:
        trt = import_tensorrt()
        cudart = import_cudart()
        self._trt, self._cudart = trt, cudart
        logger = trt.Logger(trt.Logger.WARNING)
        runtime = trt.Runtime(logger)
        engine = runtime.deserialize_cuda_engine(self.path.read_bytes())
        if engine is None:
            raise ModelError(f"TensorRT could not deserialise {self.path.name} (see its log above)")
        context = engine.create_execution_context()
        if context is None:
            raise ModelError(f"TensorRT could not create an execution context for {self.path.name}")
        err, stream = cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking)
        check_cuda(cudart, err, "cudaStreamCreateWithFlags")
        self._engine, self._context, self._stream = engine, context, stream
        self._stream_handle = native_handle(stream)
        self._active = True
        try:
            for name in self.input_names:  # the largest shapes, to size every buffer once
                context.set_input_shape(name, self.manifest.profiles[name].max)
            for name in [*self.input_names, *self.output_names]:
                shape = tuple(context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise ModelError(f"{self.path.name}: output {name!r} has a data-dependent shape {shape}")
                self._bindings[name] = self._allocate(name, np.dtype(trt.nptype(engine.get_tensor_dtype(name))), shape)
                context.set_tensor_address(name, self._bindings[name].device)
        except BaseException:
            self._release()
            raise

    def _allocate(self, name: str, dtype: np.dtype[Any], shape: tuple[int, ...]) -> _Binding:
        cudart = self._cudart
        count = max(1, math.prod(shape))
        nbytes = count * dtype.itemsize
        err, device = cudart.cudaMalloc(nbytes)
        check_cuda(cudart, err, "cudaMalloc")
        err, host_pointer = cudart.cudaMallocHost(nbytes)
        if err != cudart.cudaError_t.cudaSuccess:
            cudart.cudaFree(device)
            check_cuda(cudart, err, "cudaMallocHost")
        buffer = (ctypes.c_byte * nbytes).from_address(int(host_pointer))
        host = np.frombuffer(memoryview(buffer).cast("B"), dtype=dtype, count=count)
        return _Binding(name, dtype, int(device), host, int(host_pointer), count)

    def close(self) -> None:
        """Free device and pinned memory and drop the engine (idempotent)."""
        with self._lock:
            self._release()

    def _release(self) -> None:
        cudart = self._cudart
        if cudart is not None:
            if self._stream is not None:
                cudart.cudaStreamSynchronize(self._stream)
            for binding in self._bindings.values():
                cudart.cudaFree(binding.device)
                cudart.cudaFreeHost(binding.host_pointer)
            if self._stream is not None:
                cudart.cudaStreamDestroy(self._stream)
        self._bindings.clear()
        self._context = None
        self._engine = None
        self._stream = None
        self._active = False

    # -- inference --------------------------------------------------------------------------------

    def run(self, feeds: Feeds) -> list[Array]:
        """Run a batch (the first axis of every input); batches over the engine's maximum run in chunks."""
        if not self._active:
            self.activate()
        return self._split(feeds)

    def _run_locked(self, feeds: Feeds) -> list[Array]:
        with self._lock, gpu_work.shared():
            return self._run_chunk(feeds)

    def _run_chunk(self, feeds: Feeds) -> list[Array]:
        cudart, context, stream = self._cudart, self._context, self._stream
        h2d = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        d2h = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
        for name in self.input_names:
            binding = self._bindings[name]
            array = np.ascontiguousarray(feeds[name], dtype=binding.dtype)
            if not self.manifest.profiles[name].accepts(tuple(array.shape)):
                profile = self.manifest.profiles[name]
                raise ModelError(
                    f"{self.path.name}: input {name!r} of shape {array.shape} is outside the engine's profile "
                    f"{profile.min}..{profile.max}"
                )
            binding.host[: array.size] = array.ravel()
            context.set_input_shape(name, array.shape)
            (err,) = cudart.cudaMemcpyAsync(binding.device, binding.host_pointer, array.nbytes, h2d, stream)
            check_cuda(cudart, err, "cudaMemcpyAsync")
        if not context.execute_async_v3(self._stream_handle):
            raise ModelError(f"TensorRT failed to enqueue {self.path.name}")
        shapes = {}
        for name in self.output_names:
            binding = self._bindings[name]
            shape = tuple(context.get_tensor_shape(name))
            shapes[name] = shape
            nbytes = math.prod(shape) * binding.dtype.itemsize
            (err,) = cudart.cudaMemcpyAsync(binding.host_pointer, binding.device, nbytes, d2h, stream)
            check_cuda(cudart, err, "cudaMemcpyAsync")
        (err,) = cudart.cudaStreamSynchronize(stream)
        check_cuda(cudart, err, "cudaStreamSynchronize")
        results = []
        for name in self.output_names:
            binding = self._bindings[name]
            count = math.prod(shapes[name])
            out = binding.host[:count].reshape(shapes[name]).copy()
            results.append(out.astype(np.float32, copy=False) if out.dtype.kind == "f" else out)
        return results
