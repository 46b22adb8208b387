"""Compare super-resolution variants with their teacher on held-out face crops: a markdown table, the same
numbers as JSON, and a PNG grid of the faces side by side.

Per variant: parameters and GMAC (`engines.model_cost`, at one stated input size), size on disk, CPU
latency (ONNX Runtime, `threads` threads, median of `latency_runs` runs on one input of that size after a
warm-up, the models taking turns run by run), and PSNR/SSIM both against the ground truth (the
high-resolution crop) and against the teacher's output, averaged over the held-out crops (outputs clipped
to 0..1, SSIM on RGB with a 7x7 window). Bicubic upscaling of the same inputs is the floor row.

Why both references: a GAN-trained teacher such as Real-ESRGAN invents texture, so on clean downscales it
scores BELOW bicubic in PSNR against the ground truth. PSNR against the ground truth therefore ranks
blur above detail and cannot say whether a smaller network kept the teacher's behaviour; PSNR/SSIM
against the teacher can (how closely the variant reproduces what it replaces), and the ground-truth
columns stay as a sanity check against collapse towards a blurry average.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from skimage.metrics import structural_similarity

from engines.distill import SRSet, onnx_session, run_teacher
from engines.model_cost import model_cost
from engines.prune import psnr


@dataclass(frozen=True)
class Variant:
    name: str
    path: Path


@dataclass
class Row:
    name: str
    kind: str  # "floor", "teacher" or "variant"
    params: int | None
    gmac: float | None
    size_mb: float | None
    latency_ms: float | None
    psnr_gt: float
    ssim_gt: float
    psnr_teacher: float | None
    ssim_teacher: float | None

    def share_of_teacher(self, teacher: Row) -> dict[str, float | None]:
        """This row's cost and ground-truth PSNR relative to the teacher's."""

        def ratio(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None or b == 0 else a / b

        return {
            "params": ratio(self.params, teacher.params),
            "gmac": ratio(self.gmac, teacher.gmac),
            "speedup": ratio(teacher.latency_ms, self.latency_ms),
            "psnr_gt": ratio(self.psnr_gt, teacher.psnr_gt),
        }


@dataclass
class Report:
    input_size: int
    scale: int
    threads: int
    items: int
    rows: list[Row]
    notes: str = ""

    @property
    def teacher(self) -> Row:
        return next(r for r in self.rows if r.kind == "teacher")

    def to_dict(self) -> dict[str, Any]:
        teacher = self.teacher
        return {
            "input_size": self.input_size,
            "scale": self.scale,
            "threads": self.threads,
            "heldout_items": self.items,
            "rows": [{**asdict(r), "relative_to_teacher": r.share_of_teacher(teacher)} for r in self.rows],
            "notes": self.notes,
        }

    def markdown(self) -> str:
        s = self.input_size
        lines = [
            f"Held-out face crops: {self.items}; cost at a {s}x{s} input ({s * self.scale}x{s * self.scale} "
            f"output); CPU latency with ONNX Runtime, {self.threads} threads, batch 1.",
            "",
            "| variant | params (M) | GMAC | size (MB) | latency (ms) | speed-up | PSNR GT (dB) | SSIM GT "
            "| PSNR vs teacher (dB) | SSIM vs teacher | PSNR GT / teacher's |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        teacher = self.teacher
        for r in self.rows:
            rel = r.share_of_teacher(teacher)
            lines.append(
                f"| {r.name} | {_fmt(r.params, 1e-6, 2)} | {_fmt(r.gmac, 1, 2)} | {_fmt(r.size_mb, 1, 1)} "
                f"| {_fmt(r.latency_ms, 1, 1)} | {_fmt(rel['speedup'], 1, 2, 'x')} | {r.psnr_gt:.2f} "
                f"| {r.ssim_gt:.4f} | {_fmt(r.psnr_teacher, 1, 2)} | {_fmt(r.ssim_teacher, 1, 4)} "
                f"| {_fmt(rel['psnr_gt'], 100, 1, '%')} |"
            )
        if self.notes:
            lines += ["", self.notes]
        return "\n".join(lines) + "\n"


def _fmt(value: float | None, factor: float, digits: int, suffix: str = "") -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and np.isinf(value):
        return "inf"
    return f"{value * factor:.{digits}f}{suffix}"


def bicubic(lr: np.ndarray, scale: int) -> np.ndarray:
    """[N, 3, h, w] -> [N, 3, s*h, s*w] with OpenCV's bicubic (a = -0.75), clipped to 0..1."""
    out = []
    for item in lr:
        hwc = item.transpose(1, 2, 0)
        up = cv2.resize(hwc, (hwc.shape[1] * scale, hwc.shape[0] * scale), interpolation=cv2.INTER_CUBIC)
        out.append(np.clip(up, 0, 1).transpose(2, 0, 1))
    return np.stack(out).astype(np.float32)


def mean_metrics(outputs: np.ndarray, reference: np.ndarray) -> tuple[float, float]:
    """Mean per-crop PSNR (dB) and SSIM of outputs against reference, [N, 3, H, W] in 0..1."""
    psnrs, ssims = [], []
    for a, b in zip(outputs, reference, strict=True):
        a_hwc = np.clip(a, 0, 1).transpose(1, 2, 0).astype(np.float64)
        b_hwc = np.clip(b, 0, 1).transpose(1, 2, 0).astype(np.float64)
        psnrs.append(psnr(a_hwc, b_hwc))
        ssims.append(float(structural_similarity(a_hwc, b_hwc, channel_axis=2, data_range=1.0)))
    return float(np.mean(psnrs)), float(np.mean(ssims))


def latencies_ms(paths: Sequence[Path], size: int, *, threads: int, runs: int) -> list[float]:
    """Median latency of each model on one [1, 3, size, size] input. The models take turns run by run, so
    a change in the machine's load (another process starting) touches them all alike."""
    sessions = [onnx_session(path, threads, spin=True) for path in paths]
    x = np.random.default_rng(0).random((1, 3, size, size), dtype=np.float32)
    feeds = [{s.get_inputs()[0].name: x} for s in sessions]
    for session, feed in zip(sessions, feeds, strict=True):
        session.run(None, feed)  # warm-up
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(runs):
        for i, (session, feed) in enumerate(zip(sessions, feeds, strict=True)):
            start = time.perf_counter()
            session.run(None, feed)
            times[i].append((time.perf_counter() - start) * 1000.0)
    return [statistics.median(t) for t in times]


def _cost(path: Path, size: int) -> tuple[int, float, float]:
    cost = model_cost(path, input_shapes={"input": [1, 3, size, size]})
    return cost.params, cost.gmacs, path.stat().st_size / 1e6


def build_report(
    heldout: SRSet,
    teacher: Variant,
    variants: Sequence[Variant],
    out_dir: Path,
    *,
    scale: int = 4,
    input_size: int = 64,
    threads: int = 2,
    latency_runs: int = 5,
    grid_items: int = 4,
    notes: str = "",
    progress: bool = True,
) -> Report:
    """Evaluate teacher and variants on `heldout` and write report.md, report.json and grid.png into
    `out_dir`. The teacher's outputs are taken from `heldout.teacher` when present."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    teacher_out = heldout.teacher
    if teacher_out is None:
        teacher_out = run_teacher(teacher.path, {"input": heldout.lr}, threads=threads, progress=progress)
    outputs: dict[str, np.ndarray] = {"bicubic": bicubic(heldout.lr, scale), teacher.name: teacher_out}
    rows = [Row("bicubic", "floor", None, None, None, None, *mean_metrics(outputs["bicubic"], heldout.hr), None, None)]
    rows[0].psnr_teacher, rows[0].ssim_teacher = mean_metrics(outputs["bicubic"], teacher_out)
    lats = latencies_ms([teacher.path, *(v.path for v in variants)], input_size, threads=threads, runs=latency_runs)
    params, gmac, size_mb = _cost(teacher.path, input_size)
    rows.append(
        Row(teacher.name, "teacher", params, gmac, size_mb, lats[0], *mean_metrics(teacher_out, heldout.hr), None, None)
    )
    for v, lat in zip(variants, lats[1:], strict=True):
        out = run_teacher(v.path, {"input": heldout.lr}, threads=threads, progress=progress, desc=v.name)
        outputs[v.name] = out
        params, gmac, size_mb = _cost(v.path, input_size)
        rows.append(
            Row(
                v.name,
                "variant",
                params,
                gmac,
                size_mb,
                lat,
                *mean_metrics(out, heldout.hr),
                *mean_metrics(out, teacher_out),
            )
        )
    report = Report(input_size, scale, threads, len(heldout), rows, notes)
    (out_dir / "report.md").write_text(report.markdown(), encoding="utf-8")
    (out_dir / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
    columns = [("LR input", _nearest(heldout.lr, scale)), *outputs.items(), ("ground truth", heldout.hr)]
    write_grid(out_dir / "grid.png", columns, grid_items)
    return report


def _nearest(lr: np.ndarray, scale: int) -> np.ndarray:
    return np.repeat(np.repeat(lr, scale, axis=2), scale, axis=3)


def write_grid(path: Path, columns: Sequence[tuple[str, np.ndarray]], items: int, label_height: int = 18) -> Path:
    """A PNG with one row per item and one labelled column per (name, [N, 3, H, W] RGB 0..1) entry."""
    n = min(items, min(len(a) for _, a in columns))
    tile_h, tile_w = columns[0][1].shape[2:]
    gap = 2
    width = len(columns) * (tile_w + gap) - gap
    canvas = np.full((label_height + n * (tile_h + gap), width, 3), 255, np.uint8)
    for c, (name, images) in enumerate(columns):
        x0 = c * (tile_w + gap)
        label = name if len(name) * 6 <= tile_w else name[: max(1, tile_w // 6 - 1)] + "."
        cv2.putText(
            canvas, label, (x0 + 2, label_height - 5), cv2.FONT_HERSHEY_SIMPLEX, 0.33, (0, 0, 0), 1, cv2.LINE_AA
        )
        for r in range(n):
            tile = np.clip(images[r].transpose(1, 2, 0), 0, 1)
            if tile.shape[:2] != (tile_h, tile_w):
                tile = cv2.resize(tile, (tile_w, tile_h), interpolation=cv2.INTER_NEAREST)
            y0 = label_height + r * (tile_h + gap)
            canvas[y0 : y0 + tile_h, x0 : x0 + tile_w] = np.rint(tile[:, :, ::-1] * 255).astype(np.uint8)
    path = Path(path)
    if not cv2.imwrite(str(path), canvas):
        raise OSError(f"cannot write {path}")
    return path
