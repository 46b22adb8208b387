"""How far a reduced-precision model's outputs are from the FP32 model's on the same inputs."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np


def psnr(reference: np.ndarray, candidate: np.ndarray, peak: float = 1.0) -> float:
    """Peak signal-to-noise ratio in dB of `candidate` against `reference`, both clipped to [0, peak].

    Identical arrays give +inf.
    """
    a = np.clip(np.asarray(reference, np.float64), 0.0, peak)
    b = np.clip(np.asarray(candidate, np.float64), 0.0, peak)
    mse = float(np.mean((a - b) ** 2))
    if mse == 0.0:
        return math.inf
    return 10.0 * math.log10(peak * peak / mse)


@dataclass(frozen=True, slots=True)
class OutputQuality:
    """One output compared with FP32. `psnr` only for image outputs (NCHW, values in [0, 1])."""

    name: str
    max_abs: float
    mean_abs: float
    psnr: float | None

    def describe(self) -> str:
        text = f"{self.name}: max abs {self.max_abs:.4g}, mean abs {self.mean_abs:.3g}"
        if self.psnr is not None:
            text += ", PSNR " + ("inf" if math.isinf(self.psnr) else f"{self.psnr:.2f} dB")
        return text


@dataclass(frozen=True, slots=True)
class QualityReport:
    """Every output of a model compared with FP32 on the same inputs (batch `items`)."""

    outputs: tuple[OutputQuality, ...]
    items: int

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    @property
    def min_psnr(self) -> float | None:
        values = [o.psnr for o in self.outputs if o.psnr is not None]
        return min(values) if values else None

    def describe(self) -> str:
        return "; ".join(o.describe() for o in self.outputs) + f" (on {self.items} inputs)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "items": self.items,
            "outputs": [
                {**asdict(o), "psnr": None if o.psnr is None or math.isinf(o.psnr) else round(o.psnr, 3)}
                for o in self.outputs
            ],
        }


def _is_image(array: np.ndarray) -> bool:
    return array.ndim == 4 and array.shape[1] in (1, 3)


def compare_outputs(
    names: Sequence[str], reference: Sequence[np.ndarray], candidate: Sequence[np.ndarray]
) -> QualityReport:
    """Compare output lists position by position. An output counts as an image (and gets a PSNR, on values
    clipped to [0, 1] as the pipeline clips them) when it is NCHW with 1 or 3 channels."""
    if len(reference) != len(candidate) or len(names) != len(reference):
        raise ValueError(f"{len(names)} names, {len(reference)} reference and {len(candidate)} candidate outputs")
    rows = []
    items = 0
    for name, ref, cand in zip(names, reference, candidate, strict=True):
        ref = np.asarray(ref)
        cand = np.asarray(cand)
        if ref.shape != cand.shape:
            raise ValueError(f"output {name!r} has shape {cand.shape}, FP32 gives {ref.shape}")
        diff = np.abs(ref.astype(np.float64) - cand.astype(np.float64))
        rows.append(
            OutputQuality(
                name=name,
                max_abs=float(diff.max(initial=0.0)),
                mean_abs=float(diff.mean()) if diff.size else 0.0,
                psnr=psnr(ref, cand) if _is_image(ref) else None,
            )
        )
        items = max(items, ref.shape[0] if ref.ndim else 1)
    return QualityReport(tuple(rows), items)


def run_onnx(
    path: Path, feeds: Mapping[str, np.ndarray], threads: int = 0, *, optimize: bool = True
) -> tuple[list[str], list[np.ndarray]]:
    """Output names and outputs of an ONNX model on the CPU provider of ONNX Runtime (`optimize=False`: with
    graph optimisations off, for graphs ORT's fusions do not take, such as FP16-scale QDQ)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if not optimize:
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    if threads:
        options.intra_op_num_threads = threads
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    outputs = session.run(names, {k: np.ascontiguousarray(v) for k, v in feeds.items()})
    return names, [np.asarray(o, np.float32) if np.asarray(o).dtype.kind == "f" else np.asarray(o) for o in outputs]


def measure(
    reference: Path, candidate: Path, feeds: Mapping[str, np.ndarray], threads: int = 0, *, optimize: bool = True
) -> QualityReport:
    """Run both ONNX models on `feeds` (ONNX Runtime, CPU) and compare every output."""
    names, ref = run_onnx(reference, feeds, threads)
    cand_names, cand = run_onnx(candidate, feeds, threads, optimize=optimize)
    if cand_names != names:
        raise ValueError(f"{candidate.name} has outputs {cand_names}, {reference.name} has {names}")
    return compare_outputs(names, ref, cand)
