"""Variants of a model judged against their teacher on the data set's held-out crops: `report.md`,
`report.json` and `grid.png`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from app.engine_jobs.inputs import load_data, model_path, passive_openmp, read_json
from app.model_store import open_model_store

if TYPE_CHECKING:
    from engines.report import Report


def report_variants(
    data: Path,
    out: Path,
    *,
    teacher: str,
    variants: list[tuple[str, str]],
    size: int,
    runs: int,
    grid: int,
    notes: str,
    threads: int,
    progress: bool,
) -> Report:
    """`variants`: (name, model name or ONNX file) pairs."""
    passive_openmp()
    from engines.report import Variant, build_report

    meta = read_json(data / "dataset.json")
    heldout = load_data(data, "heldout")
    store = open_model_store()
    teacher_path = model_path(teacher, store)
    if Path(meta["teacher"]).name != teacher_path.name:
        heldout.teacher = None  # cached outputs belong to another teacher: run this one
    return build_report(
        heldout,
        Variant(teacher_path.stem, teacher_path),
        [Variant(name, model_path(file, store)) for name, file in variants],
        out,
        scale=int(meta["scale"]),
        input_size=size,
        threads=threads,
        latency_runs=runs,
        grid_items=grid,
        notes=notes,
        progress=progress,
    )
