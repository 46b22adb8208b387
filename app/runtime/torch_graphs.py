"""What a CUDA graph needs of an onnx2torch module, and the process-wide rules for capturing one.

* Host reads. onnx2torch's Reshape, Resize, Pad, Split, Expand, Tile, Slice, (Un)Squeeze and
  ConstantOfShape modules read their shape argument on the host (`.tolist()`, `torch.Size(tensor)`).
  When that argument is a module buffer on the GPU, every call synchronises, and a capture fails.
  `keep_shape_constants_on_host` hands those modules a CPU copy of their constant arguments instead:
  the host read then costs nothing and captures. Arguments computed from the input (`Shape -> ...`)
  are made constant first, per input shape, by `engines.onnx_static.static_shapes`.
* Capture. PyTorch forbids other CUDA work in the process during a capture in its default "global"
  error mode, and a capture synchronises the device and empties the allocator's cache. Every model run
  therefore holds `gpu_work.shared()`; a capture holds `gpu_work.exclusive()` (no run of another model
  in flight) and captures in "thread_local" mode.
* Outcomes of every capture are counted per model; `CaptureCollector` shows them in a server's registry
  as `swapcast_cuda_graph_captures_total`.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

# onnx2torch modules that read their non-data arguments on the host.
HOST_READING_MODULES = frozenset(
    {
        "OnnxReshape",
        "OnnxResize",
        "OnnxResizeV10",
        "OnnxPadDynamic",
        "OnnxSplit13",
        "OnnxExpand",
        "OnnxTile",
        "OnnxConstantOfShape",
        "OnnxSlice",
        "OnnxSqueezeDynamicAxes",
        "OnnxUnsqueezeDynamicAxes",
    }
)
CAPTURE_OUTCOMES = ("captured", "failed", "dynamic_shapes", "over_limit")


def keep_shape_constants_on_host(module: Any) -> int:
    """Rewrite an onnx2torch GraphModule (in place) so that host-reading modules get CPU copies of their
    constant arguments. Returns how many arguments were moved; call before moving the module to a device."""
    import torch

    moved = 0
    graph = module.graph
    for node in list(graph.nodes):
        if node.op != "call_module":
            continue
        inner = module.get_submodule(node.target)
        if type(inner).__name__ not in HOST_READING_MODULES:
            continue
        host: dict[int | str, Any] = {}
        args = list(node.args)
        kwargs = dict(node.kwargs)
        keys: list[tuple[int | str, Any]] = [*enumerate(args), *kwargs.items()]
        for key, arg in keys:
            if key == 0 and type(inner).__name__ != "OnnxConstantOfShape":
                continue  # the data input
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                host[key] = _attribute(module, str(arg.target)).detach().to("cpu").clone()
                if isinstance(key, int):
                    args[key] = None
                else:
                    kwargs[key] = None
        if not host:
            continue
        wrapper = _host_wrapped(inner, host)
        _set_submodule(module, node.target, wrapper)
        node.args = tuple(args)
        node.kwargs = kwargs
        moved += len(host)
    graph.eliminate_dead_code()
    module.recompile()
    return moved


def _attribute(module: Any, target: str) -> Any:
    owner = module
    *path, name = target.split(".")
    for part in path:
        owner = getattr(owner, part)
    return getattr(owner, name)


def _set_submodule(module: Any, target: str, replacement: Any) -> None:
    owner = module
    *path, name = target.split(".")
    for part in path:
        owner = getattr(owner, part)
    setattr(owner, name, replacement)


def _host_wrapper_class() -> type:
    from torch import nn

    class HostWrapped(nn.Module):
        """Calls `inner` with some arguments replaced by CPU tensors. They are a plain attribute, not
        buffers, so `.to(device)` and `.half()` leave them on the CPU in their own dtype."""

        host: dict[int | str, Any]

        def __init__(self, inner: nn.Module, host: dict[int | str, Any]) -> None:
            super().__init__()
            self.inner = inner
            self.__dict__["host"] = host

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            args = tuple(self.host.get(i, a) for i, a in enumerate(args))
            kwargs = {key: self.host.get(key, value) for key, value in kwargs.items()}
            return self.inner(*args, **kwargs)

    return HostWrapped


_wrapper: type | None = None


def _host_wrapped(inner: Any, host: dict[int | str, Any]) -> Any:
    """A HostWrapped module (its class is made on first use: this module imports without torch)."""
    global _wrapper
    if _wrapper is None:
        _wrapper = _host_wrapper_class()
    return _wrapper(inner, host)


def host_reads(module: Any, example: list[Any]) -> str | None:
    """Run `module` on meta-device copies of `example`: any read of a device tensor on the host fails there
    (a meta tensor has no data). None when the forward pass completes; the error otherwise. Runs on a CPU.
    """
    import copy

    import torch

    meta = copy.deepcopy(module).to("meta")
    inputs = [torch.empty(t.shape, dtype=t.dtype, device="meta") for t in example]
    try:
        with torch.inference_mode():
            meta(*inputs)
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return None


class SharedExclusiveLock:
    """Many holders of `shared()` at once, or one of `exclusive()`; a waiting exclusive holder goes first."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._exclusive or self._waiting:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        with self._cond:
            self._waiting += 1
            while self._exclusive or self._shared:
                self._cond.wait()
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            with self._cond:
                self._exclusive = False
                self._cond.notify_all()


gpu_work = SharedExclusiveLock()
"""Held shared by every model run on a GPU, exclusively by a CUDA-graph capture."""


_captures: collections.Counter[tuple[str, str]] = collections.Counter()
_captures_lock = threading.Lock()


def count_capture(model: str, outcome: str) -> None:
    with _captures_lock:
        _captures[(model, outcome)] += 1


def capture_counts() -> dict[tuple[str, str], int]:
    """(model, outcome) -> captures in this process so far."""
    with _captures_lock:
        return dict(_captures)


class CaptureCollector(Collector):
    """`swapcast_cuda_graph_captures_total{model, outcome}` for a registry (captures are process-wide)."""

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "swapcast_cuda_graph_captures",
            "CUDA-graph captures by model and outcome (captured, failed, dynamic_shapes, over_limit).",
            labels=["model", "outcome"],
        )
        for (model, outcome), count in sorted(capture_counts().items()):
            family.add_metric([model, outcome], count)
        yield family
