"""The GPU stack's versions, and what is wrong with a combination of them, read without loading CUDA.

* cuda-bindings release the GIL inside `cudaStreamSynchronize` only from 12.9.1 (12.x) and 13.0 on;
  before, a thread waiting for its engine stops every other Python thread of the server.
* TensorRT wheels are built for one CUDA major (`tensorrt-cu12`, `tensorrt-cu13`); the CUDA bindings and
  PyTorch should load the same major, or the process carries two CUDA runtimes.
* TensorRT 10 builds with builder flags and a calibrator, 11 strongly typed (`engines.tensorrt.build`):
  the build mode follows the installed major; anything else is unknown ground.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata

GIL_RELEASING_BINDINGS = {12: (12, 9, 1), 13: (13, 0, 0)}
KNOWN_TENSORRT_MAJORS = (10, 11)


def _parts(version: str | None) -> tuple[int, ...]:
    if not version:
        return ()
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def _installed(*names: str) -> tuple[str, str] | None:
    for name in names:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


@dataclass(frozen=True)
class GpuStack:
    tensorrt: str | None  # version of the tensorrt package
    tensorrt_cuda: int | None  # CUDA major its wheel is built for (from the distribution name)
    cuda_bindings: str | None
    torch_cuda: str | None  # torch.version.cuda, None for a CPU build or no torch

    def to_dict(self) -> dict[str, object]:
        return {
            "tensorrt": self.tensorrt,
            "tensorrt_cuda_major": self.tensorrt_cuda,
            "cuda_bindings": self.cuda_bindings,
            "torch_cuda": self.torch_cuda,
        }


def installed_stack(torch_cuda: str | None = None) -> GpuStack:
    """What is installed (from package metadata; imports nothing). `torch_cuda` is torch.version.cuda."""
    trt = _installed("tensorrt", "tensorrt-cu13", "tensorrt-cu12")
    cuda_major = None
    for major in (13, 12):
        if _installed(f"tensorrt-cu{major}", f"tensorrt-cu{major}-libs", f"tensorrt-cu{major}-bindings"):
            cuda_major = major
            break
    bindings = _installed("cuda-bindings", "cuda-python")
    return GpuStack(trt[1] if trt else None, cuda_major, bindings[1] if bindings else None, torch_cuda)


def stack_problems(stack: GpuStack) -> list[str]:
    """What is wrong with this combination (empty: nothing known)."""
    problems = []
    bindings = _parts(stack.cuda_bindings)
    if bindings:
        floor = GIL_RELEASING_BINDINGS.get(bindings[0])
        if floor is None or bindings < floor:
            problems.append(
                f"cuda-bindings {stack.cuda_bindings} holds the GIL in cudaStreamSynchronize "
                "(released from 12.9.1 / 13.0): pip install 'swapcast[gpu]'"
            )
    trt = _parts(stack.tensorrt)
    if trt and trt[0] not in KNOWN_TENSORRT_MAJORS:
        problems.append(f"TensorRT {stack.tensorrt} is neither 10 nor 11, the majors swapcast builds for")
    if trt and not bindings:
        problems.append("TensorRT is installed without the CUDA bindings (cuda-python)")
    majors = {
        "TensorRT": stack.tensorrt_cuda,
        "cuda-bindings": bindings[0] if bindings else None,
        "PyTorch": _parts(stack.torch_cuda)[0] if _parts(stack.torch_cuda) else None,
    }
    known = {name: major for name, major in majors.items() if major is not None}
    if len(set(known.values())) > 1:
        listed = ", ".join(f"{name} CUDA {major}" for name, major in known.items())
        problems.append(f"CUDA majors differ ({listed}): two CUDA runtimes in one process")
    return problems
