"""PyTorch behind the `app.runtime.model.Model` interface: the ONNX graph converted with onnx2torch.

* Precision: "fp16" runs in half precision on CUDA. On a CPU it stays FP32 (said once in the log):
  PyTorch's CPU FP16 convolutions are slow and bf16 loses three more bits of mantissa than FP16 for
  no speed-up on CPUs without AMX; "bf16" can still be asked for explicitly.
* Channels-last memory format for the convolutions, by default on CUDA only.
* FP32 is IEEE FP32: PyTorch runs convolutions in TF32 on Ampere and later GPUs by default, 10 bits of
  mantissa, which moves results by about 1e-3; `precision="fp32"` on CUDA turns that off (process-wide;
  from then on PyTorch refuses reads of the legacy `allow_tf32` flags, whose setters mix badly with the
  new `fp32_precision` API).
* CUDA graphs: a graph is captured per input shape (batch size included), at warm-up through
  `prepare_graphs` or on first use, and replayed after. onnx2torch's shape-reading modules get their
  constant arguments as CPU tensors (`app.runtime.torch_graphs`), and a graph that computes shapes from
  its input (RetinaFace's `Shape -> Concat -> Resize`) is folded per captured shape into constants
  (`engines.onnx_static`) first, so the captured module reads nothing back from the GPU. A capture
  holds the process-wide `gpu_work` lock exclusively (no other model's run in flight) and uses
  "thread_local" error mode; all graphs of a model share one memory pool; a shape whose capture failed,
  or one over `max_graphs`, runs eagerly from then on without retrying. Outcomes are counted in
  `swapcast_cuda_graph_captures_total` and listed by `graph_outcomes`.

onnx2torch needs Conv weights as initializers; exporters sometimes route shared weights through
Identity nodes or Constant nodes (RetinaFace's SSH blocks do), so those are folded into initializers
before conversion.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
from onnx import TensorProto

from app.errors import ModelError
from app.runtime.model import Array, BatchSplitter, Feeds
from app.runtime.torch_graphs import count_capture, gpu_work, keep_shape_constants_on_host
from engines.onnx_static import host_shape_inputs, static_shapes

log = logging.getLogger(__name__)

TorchPrecision = Literal["fp32", "fp16", "bf16"]
TORCH_MISSING = "PyTorch is not installed: pip install 'swapcast[torch]'"


def import_torch() -> Any:
    try:
        return importlib.import_module("torch")
    except ImportError:
        raise ModelError(TORCH_MISSING) from None


def ieee_fp32(torch: Any) -> None:
    """Run FP32 convolutions and matmuls in IEEE FP32, not TF32 (process-wide)."""
    conv = getattr(torch.backends.cudnn, "conv", None)
    if conv is not None and hasattr(conv, "fp32_precision"):  # torch >= 2.9; mixing with allow_tf32 raises
        conv.fp32_precision = "ieee"
        torch.backends.cuda.matmul.fp32_precision = "ieee"
    else:
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False


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
        max_graphs: int = 40,
        threads: int | None = None,
    ) -> None:
        torch = import_torch()
        if importlib.util.find_spec("onnx2torch") is None:
            raise ModelError("onnx2torch is not installed: pip install 'swapcast[torch]'")
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
        if self.precision == "fp32" and on_cuda:
            ieee_fp32(torch)
        self._module: Any = self._convert(model)
        # Shapes computed from the input need folding per captured shape (the graph is kept for that).
        self.shapes_from_input = bool(host_shape_inputs(model))
        self._onnx = model if self.shapes_from_input else None
        self._graphs: dict[tuple[Any, ...], _Captured] = {}
        self.graph_outcomes: dict[tuple[Any, ...], str] = {}  # every shape tried: captured, failed, ...
        self._pool: Any = None
        self._graph_lock = threading.Lock()
        self._split = BatchSplitter(self.path.name, 1 if self.fixed_batch else None, self._run_batch)

    def _convert(self, model: onnx.ModelProto) -> Any:
        from onnx2torch import convert

        torch = self._torch
        try:
            module = convert(model)
        except Exception as exc:  # onnx2torch raises NotImplementedError, KeyError... for what it cannot map
            raise ModelError(f"onnx2torch cannot convert {self.path.name}: {type(exc).__name__}: {exc}") from exc
        keep_shape_constants_on_host(module)
        module = module.eval().to(self.device)
        if self.dtype != torch.float32:
            module = module.to(self.dtype)
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)
        return module

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
        with self._graph_lock:
            self._graphs.clear()
            self._pool = None
        self._module = None
        self._onnx = None
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

    def _forward(self, tensors: list[Any], module: Any = None) -> list[Any]:
        out = (module or self.module)(*tensors)
        return list(out) if isinstance(out, tuple | list) else [out]

    def prepare_graphs(self, shapes: list[Mapping[str, tuple[int, ...]]]) -> dict[tuple[Any, ...], str]:
        """Capture a CUDA graph for each set of input shapes now (warm-up, before serving); returns the
        outcome per shape. Without CUDA graphs (on a CPU, or turned off) nothing is captured."""
        if self.cuda_graphs:
            for shape in shapes:
                feeds = {name: np.zeros(shape[name], np.float32) for name in self.input_names}
                self._run_batch(feeds)
        return dict(self.graph_outcomes)

    def _key(self, tensors: list[Any]) -> tuple[Any, ...]:
        return tuple((tuple(t.shape), t.dtype) for t in tensors)

    def _captured(self, tensors: list[Any]) -> _Captured | None:
        """The CUDA graph for these input shapes, captured on first use (None: run eagerly)."""
        key = self._key(tensors)
        with self._graph_lock:
            if key in self._graphs or key in self.graph_outcomes:
                return self._graphs.get(key)
            if len(self._graphs) >= self.max_graphs:
                outcome, captured = "over_limit", None
            else:
                outcome, captured = self._capture(tensors)
            self.graph_outcomes[key] = outcome
            if captured is not None:
                self._graphs[key] = captured
        count_capture(self.path.stem, outcome)
        return captured

    def _static_module(self, tensors: list[Any]) -> Any:
        """The module to capture for these shapes: the shared one, or one folded for them (None: impossible)."""
        if self._onnx is None:
            return self.module
        shapes = {name: tuple(t.shape) for name, t in zip(self.input_names, tensors, strict=True)}
        try:
            folded = static_shapes(self._onnx, shapes)
        except Exception as exc:  # shape inference and the reference evaluator raise many types: run eagerly
            log.warning("%s: cannot fold shapes %s (%s); running eagerly", self.path.name, shapes, exc)
            return None
        left = host_shape_inputs(folded)
        if left:
            log.warning("%s: shapes still computed at run time (%s); running eagerly", self.path.name, left[0])
            return None
        return self._convert(folded)

    def _capture(self, tensors: list[Any]) -> tuple[str, _Captured | None]:
        torch = self._torch
        module = self._static_module(tensors)
        if module is None:
            return "dynamic_shapes", None
        static = [t.clone() for t in tensors]
        with gpu_work.exclusive():  # no other model's CUDA work while this one captures
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(2):  # warm-up outside the graph: lazy initialisations must not be captured
                        self._forward(static, module)
                torch.cuda.current_stream().wait_stream(side)
                if self._pool is None:
                    self._pool = torch.cuda.graph_pool_handle()  # one pool for all of this model's graphs
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                    outputs = self._forward(static, module)
            except RuntimeError as exc:
                key = self._key(tensors)
                log.warning("%s: CUDA graph capture failed for %s (%s); running eagerly", self.path.name, key, exc)
                return "failed", None
        return "captured", _Captured(graph, static, outputs)

    def _run_batch(self, feeds: Feeds) -> list[Array]:
        torch = self._torch
        tensors = [self._tensor(feeds[name]) for name in self.input_names]
        with torch.inference_mode():
            captured = self._captured(tensors) if self.cuda_graphs else None
            with gpu_work.shared():
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
