"""PyTorch behind the `app.runtime.model.Model` interface: the ONNX graph converted with onnx2torch.

* Precision: "fp16" runs in half precision on CUDA. On a CPU it stays FP32 (said once in the log):
  PyTorch's CPU FP16 convolutions are slow and bf16 loses three more bits of mantissa than FP16 for
  no speed-up on CPUs without AMX; "bf16" can still be asked for explicitly.
* Channels-last memory format for the convolutions, by default on CUDA only.
* CUDA graphs: the first call with a new input shape (batch size included) captures a graph for it,
  later calls with that shape replay it. Capture is CUDA-only, bounded to `max_graphs` shapes (least
  recently used dropped), and a shape whose capture fails (graphs with host-side shape arithmetic)
  runs eagerly from then on.

onnx2torch needs Conv weights as initializers; exporters sometimes route shared weights through
Identity nodes or Constant nodes (RetinaFace's SSH blocks do), so those are folded into initializers
before conversion.
"""

from __future__ import annotations

import importlib
import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto

from app.errors import ModelError
from app.runtime.model import Array, BatchSplitter, Feeds

log = logging.getLogger(__name__)

TorchPrecision = Literal["fp32", "fp16", "bf16"]
TORCH_MISSING = "PyTorch is not installed: pip install 'swapcast[torch]'"


def import_torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise ModelError(TORCH_MISSING) from None


def fold_aliases(model: onnx.ModelProto) -> int:
    """Turn Constant nodes and Identity nodes over initializers into initializers (in place).

    Returns how many nodes were folded. Outputs of the graph are left alone.
    """
    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    graph_outputs = {o.name for o in graph.output}
    kept = []
    folded = 0
    for node in graph.node:
        tensor = None
        if node.output and node.output[0] not in graph_outputs:
            if node.op_type == "Identity" and node.input[0] in initializers:
                tensor = initializers[node.input[0]]
            elif node.op_type == "Constant" and len(node.attribute) == 1 and node.attribute[0].name == "value":
                tensor = node.attribute[0].t
        if tensor is None:
            kept.append(node)
            continue
        copy = TensorProto()
        copy.CopyFrom(tensor)
        copy.name = node.output[0]
        graph.initializer.append(copy)
        initializers[copy.name] = copy
        folded += 1
    del graph.node[:]
    graph.node.extend(kept)
    return folded


@dataclass
class _Captured:
    graph: Any
    inputs: list[Any]
    outputs: list[Any]


def _declared_shape(value: onnx.ValueInfoProto) -> list[int | str | None]:
    dims: list[int | str | None] = []
    for dim in value.type.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param"):
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return dims


class TorchModel:
    """An ONNX model converted to a torch module. `run` takes a whole batch; graphs with a fixed batch of 1
    run item by item (`app.runtime.model.BatchSplitter`)."""

    def __init__(
        self,
        path: Path,
        *,
        device: str | None = None,
        precision: TorchPrecision = "fp32",
        channels_last: bool | None = None,
        cuda_graphs: bool = True,
        max_graphs: int = 8,
        threads: int | None = None,
    ) -> None:
        torch = import_torch()
        try:
            from onnx2torch import convert
        except ImportError:
            raise ModelError("onnx2torch is not installed: pip install 'swapcast[torch]'") from None
        self.path = Path(path)
        self._torch = torch
        try:
            model = onnx.load(str(self.path))
        except Exception as exc:  # protobuf raises several unrelated types on a corrupt file
            raise ModelError(f"cannot load model {self.path}: {exc}") from exc
        fold_aliases(model)
        initializers = {init.name for init in model.graph.initializer}
        feeds = [value for value in model.graph.input if value.name not in initializers]
        self.input_names = [value.name for value in feeds]
        self.output_names = [value.name for value in model.graph.output]
        self.input_shape: list[int | str | None] = _declared_shape(feeds[0])
        self.fixed_batch = isinstance(self.input_shape[0], int) and self.input_shape[0] == 1

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        on_cuda = self.device.type == "cuda"
        if precision == "fp16" and not on_cuda:
            log.info("%s: fp16 was asked for on a CPU; the torch backend runs FP32 there", self.path.name)
        self.precision: TorchPrecision = precision if (precision != "fp16" or on_cuda) else "fp32"
        self.dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[self.precision]
        self.channels_last = on_cuda if channels_last is None else channels_last
        self.cuda_graphs = cuda_graphs and on_cuda
        self.max_graphs = max_graphs
        if threads and not on_cuda:
            torch.set_num_threads(threads)
        try:
            module = convert(model)
        except Exception as exc:  # onnx2torch raises NotImplementedError, KeyError... for what it cannot map
            raise ModelError(f"onnx2torch cannot convert {self.path.name}: {type(exc).__name__}: {exc}") from exc
        module = module.eval().to(self.device)
        if self.dtype != torch.float32:
            module = module.to(self.dtype)
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)
        self._module: Any = module
        self._graphs: OrderedDict[tuple[Any, ...], _Captured | None] = OrderedDict()
        self._split = BatchSplitter(self.path.name, 1 if self.fixed_batch else None, self._run_batch)

    @property
    def providers(self) -> list[str]:
        return [f"torch:{self.device.type}:{self.precision}"]

    @property
    def module(self) -> Any:
        if self._module is None:
            raise ModelError(f"model {self.path.name} is closed")
        return self._module

    def close(self) -> None:
        """Drop the module and the captured CUDA graphs, and hand cached device memory back. Idempotent."""
        if self._module is None:
            return
        self._graphs.clear()
        self._module = None
        if self.device.type == "cuda":
            self._torch.cuda.empty_cache()

    def _tensor(self, array: np.ndarray) -> Any:
        torch = self._torch
        tensor = torch.from_numpy(np.ascontiguousarray(array)).to(self.device)
        if tensor.is_floating_point():
            tensor = tensor.to(self.dtype)
        if self.channels_last and tensor.ndim == 4:
            tensor = tensor.contiguous(memory_format=torch.channels_last)
        return tensor

    def _forward(self, tensors: list[Any]) -> list[Any]:
        out = self.module(*tensors)
        return list(out) if isinstance(out, tuple | list) else [out]

    def _captured(self, tensors: list[Any]) -> _Captured | None:
        """The CUDA graph for these input shapes, captured on first use (None: run eagerly)."""
        torch = self._torch
        key = tuple((tuple(t.shape), t.dtype) for t in tensors)
        if key in self._graphs:
            self._graphs.move_to_end(key)
            return self._graphs[key]
        static = [t.clone() for t in tensors]
        captured: _Captured | None
        try:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # warm-up outside the graph: lazy initialisations must not be captured
                    self._forward(static)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                outputs = self._forward(static)
            captured = _Captured(graph, static, outputs)
        except RuntimeError as exc:
            log.warning("%s: CUDA graph capture failed for shapes %s (%s); running eagerly", self.path.name, key, exc)
            captured = None
        self._graphs[key] = captured
        while len(self._graphs) > self.max_graphs:
            self._graphs.popitem(last=False)
        return captured

    def _run_batch(self, feeds: Feeds) -> list[Array]:
        torch = self._torch
        tensors = [self._tensor(feeds[name]) for name in self.input_names]
        with torch.inference_mode():
            captured = self._captured(tensors) if self.cuda_graphs else None
            if captured is None:
                outputs = self._forward(tensors)
            else:
                for static, tensor in zip(captured.inputs, tensors, strict=True):
                    static.copy_(tensor)
                captured.graph.replay()
                outputs = captured.outputs
            return [np.ascontiguousarray(o.float().cpu().numpy()) for o in outputs]

    def run(self, feeds: Feeds) -> list[Array]:
        """Run a batch (the first axis of every input)."""
        return self._split(feeds)
