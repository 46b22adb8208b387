"""The data set every smaller model is made and judged with: face crops of the sample photos, degraded inputs and
the teacher's outputs, split by photo (`train.npz`, `heldout.npz`, `scan.npz` and `dataset.json`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from app.engine_jobs.inputs import face_sources, model_path, passive_openmp, photos, write_json
from app.errors import UserError
from app.model_store import open_model_store


def _scale_of(path: Path, threads: int) -> int:
    from engines.distill import run_teacher

    probe = np.zeros((1, 3, 8, 8), np.float32)
    out = run_teacher(path, {"input": probe}, threads=threads, progress=False)
    if out.shape[2] % 8:
        raise UserError(f"{path.name} does not upscale by a whole factor ({out.shape[2]} from 8)")
    return out.shape[2] // 8


def make_dataset(
    out: Path,
    *,
    teacher: str,
    photo_names: list[str] | None,
    heldout: list[str],
    lr_size: int,
    train_count: int,
    heldout_count: int,
    scan_count: int,
    seed: int,
    threads: int,
    progress: bool,
) -> dict[str, Any]:
    """Write the data set into `out`; returns what `dataset.json` records (`photo_names`: None for all)."""
    passive_openmp()
    from engines.distill import Augment, Degradation, make_sr_set, run_teacher, save_set, split_by_image

    store = open_model_store()
    teacher_path = model_path(teacher, store)
    scale = _scale_of(teacher_path, threads)
    sources = face_sources(photos(photo_names), threads, store)
    train_photos, heldout_photos = split_by_image(sources, heldout)
    train = make_sr_set(
        train_photos,
        train_count,
        lr_size=lr_size,
        scale=scale,
        seed=seed,
        augment=Augment(),
        degradation=Degradation(),
    )
    held = make_sr_set(heldout_photos, heldout_count, lr_size=lr_size, scale=scale, seed=seed + 1)
    scan = make_sr_set(heldout_photos, scan_count, lr_size=lr_size, scale=scale, seed=seed + 2)
    train.teacher = run_teacher(teacher_path, {"input": train.lr}, threads=threads, progress=progress)
    held.teacher = run_teacher(teacher_path, {"input": held.lr}, threads=threads, progress=progress)
    save_set(out / "train.npz", train)
    save_set(out / "heldout.npz", held)
    save_set(out / "scan.npz", scan)
    meta = {
        "teacher": str(teacher_path),
        "scale": scale,
        "lr_size": lr_size,
        "seed": seed,
        "train_photos": [s.image_id for s in train_photos],
        "heldout_photos": [s.image_id for s in heldout_photos],
        "faces": {s.image_id: len(s.faces) for s in sources},
        "counts": {"train": len(train), "heldout": len(held), "scan": len(scan)},
        "train": "augmented (flip, rotation, zoom-out, colour jitter), degraded (blur, downscale, noise, JPEG)",
        "heldout": "clean area downscale, no augmentation",
    }
    write_json(out / "dataset.json", meta)
    return meta
