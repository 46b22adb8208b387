"""INT8 calibration for TensorRT's builder, fed by the same CalibrationSet as ONNX Runtime's quantizer.

The builder asks for one batch at a time (`get_batch`) until told there are no more, and offers to
read and write a calibration cache so a rebuild can skip the pass. The batching and cache logic lives in
plain classes (`CalibrationBatches`, `CalibrationCache`) that need neither TensorRT nor a GPU; the
TensorRT subclass made by `entropy_calibrator` only adds device buffers and copies.

With dynamic shapes TensorRT calibrates at the calibration profile's shapes, so every batch it is given
must be full: a short last batch is topped up with items from the start of the set (said in the log).
Such duplicates weigh a few items twice in the histograms and nothing else.

TensorRT 10's Python binding prints an exception raised inside `get_batch` and reads it as "no more
data": calibration would end early and silently, on the batches seen so far. `CalibrationFeed` keeps the
exception, returns None, and `raise_error` raises it once the build returns.

The cache is named after the calibration data's digest and the TensorRT version
(`engines.model_files.keyed_calibration_cache`): a cache made from other data, or by another TensorRT,
is never read.

TensorRT 10.1 deprecated implicit INT8 calibration and TensorRT 11 removed it; there the build uses
explicit quantization (the QDQ ONNX of `engines.precision.int8`) instead, see `engines.tensorrt.build`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engines.atomic import write_bytes_atomic
from engines.errors import ModelError
from engines.precision.int8 import CalibrationSet

log = logging.getLogger(__name__)


class CalibrationBatches:
    """Cuts a CalibrationSet into batches of `batch_size` items, in order, each item exactly once.

    Items are the rows of the samples' arrays (a sample of batch 1 is one item). `next_batch` returns
    a dict of arrays (input name -> [batch, ...]) or None once every item has been handed out; after
    None it keeps returning None until `reset`. With `fill_last` a short last batch is filled up with
    items from the start of the set so that every batch has `batch_size` rows.
    """

    def __init__(
        self,
        calibration: CalibrationSet,
        batch_size: int,
        input_names: Sequence[str] | None = None,
        *,
        fill_last: bool = False,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        names = list(input_names) if input_names is not None else calibration.input_names
        missing = [name for name in names if name not in calibration.input_names]
        if missing:
            raise ValueError(f"calibration data for {calibration.model} has no input {missing[0]!r}")
        self.names = names
        self.batch_size = batch_size
        self.fill_last = fill_last
        self._items = {
            name: np.concatenate([np.asarray(s[name]) for s in calibration.samples], axis=0) for name in names
        }
        counts = {arr.shape[0] for arr in self._items.values()}
        if len(counts) != 1:
            raise ValueError("calibration inputs disagree on the number of items")
        self.total = counts.pop()
        self.position = 0
        self.batches_given = 0
        self.filled = 0  # items repeated to fill the last batch

    @property
    def batch_count(self) -> int:
        return -(-self.total // self.batch_size)

    def item_shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._items[name].shape[1:])

    def item_dtype(self, name: str) -> np.dtype[Any]:
        return self._items[name].dtype

    def next_batch(self) -> dict[str, np.ndarray] | None:
        if self.position >= self.total:
            return None
        start, stop = self.position, min(self.position + self.batch_size, self.total)
        batch = {name: arr[start:stop] for name, arr in self._items.items()}
        short = self.batch_size - (stop - start)
        if short and self.fill_last:
            take = np.arange(short) % self.total
            batch = {name: np.concatenate([part, self._items[name][take]]) for name, part in batch.items()}
            self.filled = short
            log.info("last calibration batch filled up with %d items from the start of the set", short)
        self.position = stop
        self.batches_given += 1
        return {name: np.ascontiguousarray(arr) for name, arr in batch.items()}

    def reset(self) -> None:
        self.position = 0
        self.batches_given = 0
        self.filled = 0


class CalibrationFeed:
    """What `get_batch` does, without TensorRT: the next batch, each input copied to the device by
    `copy(name, array) -> device pointer`. An exception is kept (see the module notes) and ends the feed."""

    def __init__(self, batches: CalibrationBatches, copy: Callable[[str, np.ndarray], int]) -> None:
        self.batches = batches
        self.copy = copy
        self.error: BaseException | None = None

    def get_batch(self, names: Sequence[str]) -> list[int] | None:
        if self.error is not None:
            return None
        try:
            batch = self.batches.next_batch()
            if batch is None:
                return None
            return [self.copy(name, batch[name]) for name in names]
        except BaseException as exc:  # noqa: BLE001 - TensorRT would swallow it: kept and raised after the build
            self.error = exc
            return None

    def raise_error(self) -> None:
        """Raise what `get_batch` caught, if anything (ModelError for an Exception, as it was otherwise)."""
        error, self.error = self.error, None
        if error is None:
            return
        if not isinstance(error, Exception):
            raise error
        given = self.batches.batches_given
        raise ModelError(
            f"INT8 calibration failed after {given} of {self.batches.batch_count} batches: "
            f"{type(error).__name__}: {error}"
        ) from error


class CalibrationCache:
    """TensorRT's calibration cache in a file (None: no cache). Writes are atomic."""

    def __init__(self, path: Path | None) -> None:
        self.path = Path(path) if path is not None else None

    def read(self) -> bytes | None:
        if self.path is None:
            return None
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        if not data:
            return None
        log.info("using the calibration cache %s", self.path)
        return data

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self.path is None:
            return
        write_bytes_atomic(self.path, bytes(data))


def entropy_calibrator(batches: CalibrationBatches, cache: CalibrationCache) -> Any:
    """A `tensorrt.IInt8EntropyCalibrator2` fed by `batches`, caching in `cache`.

    Imports TensorRT and the CUDA runtime bindings; ModelError when they are missing. Device buffers
    for one batch are allocated here and freed by the calibrator's `free()`.
    """
    from engines.tensorrt.manifest import check_cuda, import_cudart, import_tensorrt

    trt = import_tensorrt()
    cudart = import_cudart()

    base: Any = trt.IInt8EntropyCalibrator2

    class _EntropyCalibrator(base):
        def __init__(self) -> None:
            base.__init__(self)
            self.batches = batches
            self.cache = cache
            self.device: dict[str, int] = {}
            self.feed = CalibrationFeed(batches, self._copy)
            for name in batches.names:
                item = np.zeros(batches.item_shape(name), batches.item_dtype(name))
                err, pointer = cudart.cudaMalloc(item.nbytes * batches.batch_size)
                check_cuda(cudart, err, "cudaMalloc")
                self.device[name] = int(pointer)

        def _copy(self, name: str, array: np.ndarray) -> int:
            host = np.ascontiguousarray(array)
            (err,) = cudart.cudaMemcpy(
                self.device[name], host.ctypes.data, host.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
            )
            check_cuda(cudart, err, "cudaMemcpy")
            return self.device[name]

        def get_batch_size(self) -> int:
            return batches.batch_size

        def get_batch(self, names: list[str]) -> list[int] | None:
            return self.feed.get_batch(names)

        def read_calibration_cache(self) -> bytes | None:
            return self.cache.read()

        def write_calibration_cache(self, cache_data: Any) -> None:
            self.cache.write(memoryview(cache_data))

        def free(self) -> None:
            for pointer in self.device.values():
                cudart.cudaFree(pointer)
            self.device.clear()

    return _EntropyCalibrator()
