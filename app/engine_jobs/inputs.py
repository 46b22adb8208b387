"""What the engine jobs share: models by name or file, the sample photos and their faces, the data-set folder,
exports and their cost, and the torch thread set-up."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from app.errors import UserError

if TYPE_CHECKING:
    from torch import nn

    from engines.distill import SourceImage, SRSet
    from engines.store import ModelStore
    from engines.swap_student import AlignedCrop


def model_path(spec: str, store: ModelStore) -> Path:
    """An ONNX file given by path, or a model the store imports or builds."""
    path = Path(spec).expanduser()
    if path.suffix == ".onnx" or path.exists():
        if not path.is_file():
            raise UserError(f"model file {path} does not exist")
        return path
    from engines.registry import get_entry

    get_entry(spec)  # a clear error for an unknown name
    return store.ensure(spec)


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")


def read_json(path: Path) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {path} ({exc}); make the folder with `swapcast engines dataset`") from None
    return data


def load_data(folder: Path, name: str) -> SRSet:
    from engines.distill import load_set

    path = folder / f"{name}.npz"
    if not path.is_file():
        raise UserError(f"{path} is missing; make the folder with `swapcast engines dataset`")
    return load_set(path)


def photos(names: list[str] | None) -> dict[str, np.ndarray]:
    """Sample photos as RGB arrays, by name."""
    from app.media.clips import load_sample, sample_faces

    available = sample_faces()
    wanted = names if names is not None else sorted(available)
    return {name: np.ascontiguousarray(load_sample(name)[:, :, ::-1]) for name in wanted}


def _detect(photos: dict[str, np.ndarray], threads: int, store: ModelStore) -> dict[str, list[Any]]:
    """Faces (app.pipeline.types.Face) found in each RGB photo."""
    from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
    from app.runtime.onnx import OnnxModel

    model = OnnxModel(store.ensure("retinaface_mnet025"), threads=threads)
    detector = RetinaFaceDetector(model, DetectorConfig(refine_landmarks=True))
    return {name: detector.process([np.ascontiguousarray(rgb[:, :, ::-1])])[0] for name, rgb in photos.items()}


def face_sources(photos: dict[str, np.ndarray], threads: int, store: ModelStore) -> list[SourceImage]:
    """The photos with their face boxes; a photo where no face is found (a tight crop such as the Tom Hanks
    sample) counts as one face filling the frame."""
    from engines.distill import SourceImage

    found = _detect(photos, threads, store)
    sources = []
    for name, rgb in photos.items():
        boxes = tuple(tuple(float(v) for v in face.box) for face in found[name])
        if not boxes:
            h, w = rgb.shape[:2]
            boxes = ((0.0, 0.0, float(w), float(h)),)
        sources.append(SourceImage(name, rgb, boxes))  # type: ignore[arg-type]
    return sources


def aligned_crops(photos: dict[str, np.ndarray], threads: int, store: ModelStore) -> list[AlignedCrop]:
    """arcface_128 crops (RGB) of every face found in the photos."""
    from app.pipeline.align import AlignSpec, estimate_matrix, warp_crop
    from engines.swap_student import AlignedCrop

    spec = AlignSpec("arcface_128", 128)
    found = _detect(photos, threads, store)
    crops = []
    for name, rgb in photos.items():
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])
        for face in found[name]:
            crop = warp_crop(bgr, estimate_matrix(face.landmarks, spec), spec.size)
            crops.append(AlignedCrop(name, np.ascontiguousarray(crop[:, :, ::-1])))
    return crops


def export(net: nn.Module, path: Path, meta: dict[str, str]) -> float:
    from engines.export import export_verified, sample_inputs

    return export_verified(net, path, feeds=sample_inputs(net, size=16, batch=2), metadata=meta)


def cost(path: Path, size: int = 64) -> dict[str, float]:
    from engines.model_cost import model_cost

    found = model_cost(path, input_shapes={"input": [1, 3, size, size]})
    return {"params": found.params, "gmac": round(found.gmacs, 3), "input_size": size}


def passive_openmp() -> None:
    """Make torch's OpenMP workers sleep, not spin, between parallel regions. On a CPU shared with other
    processes spinning workers steal each other's cores, and training runs several times slower. Only
    effective before torch is first imported, so every job calls this first."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def set_threads(threads: int) -> None:
    passive_openmp()
    import torch

    torch.set_num_threads(threads)
