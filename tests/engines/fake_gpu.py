"""Stand-ins for `tensorrt` and `cuda.bindings.runtime` that follow their documented Python APIs closely
enough to drive swapcast's build and run code on a machine without a GPU.

They check what the real ones would (the parser refuses what onnx-tensorrt refuses where a test asks it
to; the builder calls the calibrator as TensorRT 10 does, swallowing its exceptions; the timing cache
rejects a damaged blob) and record what they were asked, so tests can assert the control flow. "Device"
memory is host memory: copies are memmoves, and the "engine" doubles its input.
"""

from __future__ import annotations

import ctypes
import json
import math
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx


@dataclass
class Record:
    """What the stand-ins were asked, for the test to read."""

    stream_flags: list[int] = field(default_factory=list)
    execute_handles: list[int] = field(default_factory=list)
    parsed: list[str] = field(default_factory=list)
    network_flags: list[int] = field(default_factory=list)
    builder_flags: list[str] = field(default_factory=list)
    calibration_batch_size: list[int] = field(default_factory=list)
    calibration_profile: dict[str, tuple[int, ...]] = field(default_factory=dict)
    batches_fed: int = 0
    cache_reads: list[bytes | None] = field(default_factory=list)
    swallowed: list[str] = field(default_factory=list)


class FakeStream:
    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __int__(self) -> int:
        return self.handle


def make_cudart(record: Record) -> types.ModuleType:
    cudart = types.ModuleType("cuda.bindings.runtime")
    memory: dict[int, Any] = {}

    class Err(int):
        @property
        def name(self) -> str:
            return "cudaSuccess" if self == 0 else "cudaErrorUnknown"

    ok = Err(0)
    cudart.cudaError_t = types.SimpleNamespace(cudaSuccess=ok)  # type: ignore[attr-defined]
    cudart.cudaMemcpyKind = types.SimpleNamespace(  # type: ignore[attr-defined]
        cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2
    )
    cudart.cudaStreamNonBlocking = 1  # type: ignore[attr-defined]

    def malloc(nbytes: int) -> tuple[Err, int]:
        buffer = ctypes.create_string_buffer(max(1, int(nbytes)))
        pointer = ctypes.addressof(buffer)
        memory[pointer] = buffer
        return ok, pointer

    def free(pointer: int) -> tuple[Err]:
        memory.pop(int(pointer))
        return (ok,)

    def memcpy(dst: int, src: int, nbytes: int, kind: int, stream: Any = None) -> tuple[Err]:
        ctypes.memmove(int(dst), int(src), int(nbytes))
        return (ok,)

    def stream_create_with_flags(flags: int) -> tuple[Err, FakeStream]:
        record.stream_flags.append(flags)
        return ok, FakeStream(0x5EED0 + len(record.stream_flags))

    def stream_create() -> tuple[Err, FakeStream]:
        return stream_create_with_flags(0)

    def properties(device: int) -> tuple[Err, Any]:
        return ok, types.SimpleNamespace(name=b"Fake GPU\x00", major=9, minor=0)

    cudart.cudaMalloc = malloc  # type: ignore[attr-defined]
    cudart.cudaMallocHost = malloc  # type: ignore[attr-defined]
    cudart.cudaFree = free  # type: ignore[attr-defined]
    cudart.cudaFreeHost = free  # type: ignore[attr-defined]
    cudart.cudaMemcpy = memcpy  # type: ignore[attr-defined]
    cudart.cudaMemcpyAsync = memcpy  # type: ignore[attr-defined]
    cudart.cudaStreamCreate = stream_create  # type: ignore[attr-defined]
    cudart.cudaStreamCreateWithFlags = stream_create_with_flags  # type: ignore[attr-defined]
    cudart.cudaStreamSynchronize = lambda stream: (ok,)  # type: ignore[attr-defined]
    cudart.cudaStreamDestroy = lambda stream: (ok,)  # type: ignore[attr-defined]
    cudart.cudaGetDeviceProperties = properties  # type: ignore[attr-defined]
    cudart.memory = memory  # type: ignore[attr-defined]
    return cudart


def make_tensorrt(major: int, record: Record, *, refuse_cubic: bool = False) -> types.ModuleType:
    """TensorRT `major` (10: builder flags and calibrators; 11: strongly typed only)."""
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.13.3.9" if major == 10 else "11.4.0.106"  # type: ignore[attr-defined]

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            self.level = level

    flags = {"FP16": "FP16", "INT8": "INT8"} if major == 10 else {"TF32": "TF32"}
    trt.Logger = Logger  # type: ignore[attr-defined]
    trt.BuilderFlag = types.SimpleNamespace(**flags)  # type: ignore[attr-defined]
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(STRONGLY_TYPED=1)  # type: ignore[attr-defined]
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE=0)  # type: ignore[attr-defined]
    trt.nptype = lambda dtype: np.float32  # type: ignore[attr-defined]

    if major == 10:

        class IInt8EntropyCalibrator2:
            def __init__(self) -> None:
                pass

        trt.IInt8EntropyCalibrator2 = IInt8EntropyCalibrator2  # type: ignore[attr-defined]

    class Tensor:
        def __init__(self, name: str) -> None:
            self.name = name

    class Network:
        def __init__(self, flags: int) -> None:
            record.network_flags.append(flags)
            self.inputs: list[str] = []
            self.outputs: list[str] = []

        @property
        def num_inputs(self) -> int:
            return len(self.inputs)

        @property
        def num_outputs(self) -> int:
            return len(self.outputs)

        def get_input(self, i: int) -> Tensor:
            return Tensor(self.inputs[i])

        def get_output(self, i: int) -> Tensor:
            return Tensor(self.outputs[i])

    class OnnxParser:
        def __init__(self, network: Network, logger: Logger) -> None:
            self.network = network
            self.errors: list[str] = []

        def parse_from_file(self, path: str) -> bool:
            model = onnx.load(path)
            record.parsed.append(Path(path).name)
            values = {i.name: i for i in model.graph.initializer}
            for node in model.graph.node:
                mode = next((a.s for a in node.attribute if a.name == "mode"), b"")
                if refuse_cubic and node.op_type == "Resize" and mode == b"cubic":
                    self.errors.append(f"In node {node.name} (importResize): UNSUPPORTED_NODE: cubic")
                source = values.get(node.input[0]) if node.input else None
                if node.op_type == "DequantizeLinear" and source is not None and source.data_type == 6:
                    self.errors.append(f"In node {node.name} (importDequantizeLinear): INT32 input")
            if self.errors:
                return False
            feeds = [i.name for i in model.graph.input if i.name not in values]
            self.network.inputs = feeds
            self.network.outputs = [o.name for o in model.graph.output]
            return True

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, i: int) -> str:
            return self.errors[i]

    class Profile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple[tuple[int, ...], ...]] = {}

        def set_shape(self, name: str, low: Any, opt: Any, high: Any) -> None:
            self.shapes[name] = (tuple(low), tuple(opt), tuple(high))

    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def serialize(self) -> bytes:
            return b"TC1 after a build"

    class Config:
        def __init__(self) -> None:
            self.int8_calibrator: Any = None
            self.calibration_profile: Profile | None = None
            self.timing_cache: TimingCache | None = None

        def set_memory_pool_limit(self, pool: int, size: int) -> None:
            pass

        def add_optimization_profile(self, profile: Profile) -> None:
            pass

        def set_flag(self, flag: str) -> None:
            record.builder_flags.append(flag)

        def set_calibration_profile(self, profile: Profile) -> None:
            self.calibration_profile = profile

        def create_timing_cache(self, data: bytes) -> TimingCache:
            if data and not bytes(data).startswith(b"TC1"):
                raise RuntimeError("Deserialization of the timing cache failed")
            return TimingCache(bytes(data))

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            self.timing_cache = cache
            return True

        def get_timing_cache(self) -> TimingCache | None:
            return self.timing_cache

    class Builder:
        def __init__(self, logger: Logger) -> None:
            pass

        def create_network(self, flags: int) -> Network:
            return Network(flags)

        def create_builder_config(self) -> Config:
            return Config()

        def create_optimization_profile(self) -> Profile:
            return Profile()

        def build_serialized_network(self, network: Network, config: Config) -> bytes | None:
            calibrator = config.int8_calibrator
            if calibrator is not None:
                assert config.calibration_profile is not None
                record.calibration_profile = {n: s[0] for n, s in config.calibration_profile.shapes.items()}
                record.calibration_batch_size.append(calibrator.get_batch_size())
                cached = calibrator.read_calibration_cache()
                record.cache_reads.append(cached)
                if not cached:
                    while True:
                        try:
                            pointers = calibrator.get_batch(list(network.inputs))
                        except Exception as exc:  # TensorRT 10's binding prints it and reads "no more data"
                            record.swallowed.append(str(exc))
                            pointers = None
                        if pointers is None:
                            break
                        record.batches_fed += 1
                    calibrator.write_calibration_cache(memoryview(b"TRT-fake-EntropyCalibration2"))
            body = {"inputs": network.inputs, "outputs": network.outputs}
            return json.dumps(body).encode()

    class Engine:
        def __init__(self, body: dict[str, Any]) -> None:
            self.body = body

        def create_execution_context(self) -> Context:
            return Context(self.body)

        def get_tensor_dtype(self, name: str) -> str:
            return "float32"

    class Context:
        """Doubles its one input into each output."""

        def __init__(self, body: dict[str, Any]) -> None:
            self.inputs, self.outputs = body["inputs"], body["outputs"]
            self.shapes: dict[str, tuple[int, ...]] = {}
            self.addresses: dict[str, int] = {}

        def set_input_shape(self, name: str, shape: Any) -> bool:
            self.shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name: str) -> tuple[int, ...]:
            return self.shapes.get(name) or self.shapes[self.inputs[0]]

        def set_tensor_address(self, name: str, address: int) -> bool:
            self.addresses[name] = address
            return True

        def execute_async_v3(self, stream: int) -> bool:
            assert isinstance(stream, int)
            record.execute_handles.append(stream)
            shape = self.shapes[self.inputs[0]]
            count = math.prod(shape)
            source = np.ctypeslib.as_array((ctypes.c_float * count).from_address(self.addresses[self.inputs[0]]))
            for name in self.outputs:
                target = np.ctypeslib.as_array((ctypes.c_float * count).from_address(self.addresses[name]))
                target[:] = source * 2
            return True

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> Engine:
            return Engine(json.loads(bytes(data)))

    trt.OnnxParser = OnnxParser  # type: ignore[attr-defined]
    trt.Builder = Builder  # type: ignore[attr-defined]
    trt.Runtime = Runtime  # type: ignore[attr-defined]
    return trt
