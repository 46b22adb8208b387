"""`swapcast bench-engines`: every variant of each model side by side, in one run, on this machine.

Models: the RetinaFace detector, the narrow reference swapper (and the full one with `full`), and
Real-ESRGAN animevideov3 x2. Variants: ONNX Runtime FP32, FP16 and INT8 (made first if missing), and
PyTorch FP32 (onnx2torch) on the CPU. TensorRT engines are left out: they need a GPU.

Per variant: latency of one model call at batch 1 (p50/p99 over `runs` calls after warm-up), size on
disk, and quality against FP32 on held-out real inputs (motion-clip frames with another seed than the
calibration data, plus the sample photos for the detector):

* detector: faces found on each sample photo (FP32's count alongside) and the largest landmark
  distance, in pixels of the photo, from the nearest FP32 face (raw detector output: no refinement
  pass, whose anchor choice among near-equal scores would add its own jitter);
* swapper: max abs and PSNR of the output (RGB in [0, 1]) over aligned face crops with random unit
  latents;
* enhancer: PSNR (and max abs) of the x2 output over aligned face crops.
"""

from __future__ import annotations

import math
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from app.calibration import calibration_frames, face_crops, letterbox
from app.media.clips import load_sample, sample_faces
from app.pipeline.detect import DetectorConfig, RetinaFaceDetector
from app.pipeline.timing import call_times, percentiles_ms
from app.runtime.onnx import OnnxModel
from engines.precision.quality import compare_outputs
from engines.precision.variants import check_variant
from engines.registry import get_entry
from engines.store import ModelStore

WARMUP = 5
EVAL_SEED = 1000
EVAL_CROPS = 8
DETECTOR = "retinaface_mnet025"


@dataclass(frozen=True)
class EnginesBenchConfig:
    full: bool = False
    runs: int = 30
    threads: int | None = None
    models: tuple[str, ...] = (DETECTOR, "reference_swapper_narrow", "realesr_animevideov3_x2")


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def latency(model: Any, feeds: Mapping[str, np.ndarray], runs: int) -> dict[str, float]:
    for _ in range(WARMUP):
        model.run(feeds)
    return percentiles_ms(call_times(lambda: model.run(feeds), runs))


def _detector_quality(reference: Any, candidate: Any) -> dict[str, Any]:
    config = DetectorConfig(refine_landmarks=False)
    ref_detector, cand_detector = RetinaFaceDetector(reference, config), RetinaFaceDetector(candidate, config)
    photos: dict[str, Any] = {}
    worst = 0.0
    for name in ("t1", "astronaut", "tom_hanks"):
        if name not in sample_faces():
            continue
        image = load_sample(name)
        (want,) = ref_detector.process([image])
        (got,) = cand_detector.process([image])
        errors = [min((float(np.abs(g.landmarks - w.landmarks).max()) for g in got), default=math.inf) for w in want]
        error = max(errors, default=0.0)
        worst = max(worst, error)
        photos[name] = {"faces_fp32": len(want), "faces": len(got), "max_landmark_error_px": round(error, 3)}
    summary = ", ".join(f"{n} {p['faces']}/{p['faces_fp32']} faces" for n, p in photos.items())
    return {"photos": photos, "max_landmark_error_px": round(worst, 3), "summary": f"{summary}; lmk err {worst:.2f} px"}


def _image_quality(reference: Any, candidate: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, Any]:
    report = compare_outputs(reference.output_names, reference.run(feeds), candidate.run(feeds))
    out = report.outputs[0]
    psnr = None if out.psnr is None else (None if math.isinf(out.psnr) else round(out.psnr, 2))
    text = f"max abs {out.max_abs:.3g}, PSNR " + ("inf" if psnr is None else f"{psnr:.2f} dB")
    return {"max_abs": out.max_abs, "psnr_db": psnr, "items": report.items, "summary": text}


def _inputs(store: ModelStore, name: str, runnable: Path, threads: int | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(batch-1 latency feeds, evaluation feeds or None for the detector)."""
    role = get_entry(name).role
    frames = calibration_frames(16, EVAL_SEED, photos_first=False)
    model = OnnxModel(runnable, threads=threads)
    names = model.input_names
    if role == "detector":
        blob = letterbox(frames[0], 640)[:, :, :480, :]  # a 640x480 frame on the tightest canvas
        return {names[0]: np.ascontiguousarray(blob)}, {}
    detector = RetinaFaceDetector(OnnxModel(store.ensure(DETECTOR), threads=threads), DetectorConfig())
    size = (get_entry(name).input_size or (128, 128))[0] if role == "swapper" else 128
    crops = face_crops(detector, EVAL_CROPS, size, frames)
    rgb = np.stack([(c[..., ::-1].astype(np.float32) / 255.0).transpose(2, 0, 1) for c, _, _ in crops])
    if role == "swapper":
        rng = np.random.default_rng(EVAL_SEED)
        latents = rng.standard_normal((len(crops), 512)).astype(np.float32)
        latents /= np.linalg.norm(latents, axis=1, keepdims=True)
        evaluation = {names[0]: rgb, names[1]: latents}
    else:
        evaluation = {names[0]: rgb}
    return {k: np.ascontiguousarray(v[:1]) for k, v in evaluation.items()}, evaluation


def bench_model(store: ModelStore, name: str, config: EnginesBenchConfig) -> list[dict[str, Any]]:
    from app.runtime.torch_backend import TorchModel
    from app.variants import make_fp16, make_int8, source_for

    source = source_for(store, name)
    for precision, make in (("fp16", make_fp16), ("int8", make_int8)):
        path = source.files.variant(precision)
        try:
            check_variant(path, source.sha256)
        except Exception:  # missing or stale: make it now
            make(store, name)
    role = get_entry(name).role
    runs = config.runs if name != "reference_swapper_full" else max(3, config.runs // 10)
    bench_feeds, evaluation = _inputs(store, name, source.runnable, config.threads)
    reference = OnnxModel(source.runnable, threads=config.threads)
    rows = []
    candidates: list[tuple[str, str, Path, Any]] = [
        ("fp32", "onnxruntime", source.runnable, reference),
        ("fp16", "onnxruntime", source.files.variant("fp16"), None),
        ("int8", "onnxruntime", source.files.variant("int8"), None),
        ("fp32", "torch", source.runnable, None),
    ]
    for precision, backend, path, loaded in candidates:
        if loaded is not None:
            model = loaded
        elif backend == "torch":
            model = TorchModel(path, device="cpu", threads=config.threads)
        else:
            model = OnnxModel(path, threads=config.threads)
        if role == "detector":
            quality = _detector_quality(reference, model)
        else:
            quality = _image_quality(reference, model, evaluation)
        rows.append(
            {
                "model": name,
                "precision": precision,
                "backend": backend,
                "file": path.name,
                "size_mb": round(path.stat().st_size / 1e6, 2),
                "latency_ms": latency(model, bench_feeds, runs),
                "batch": 1,
                "input_shapes": {k: list(v.shape) for k, v in bench_feeds.items()},
                "quality_vs_fp32": quality,
            }
        )
    return rows


def run_engines_bench(store: ModelStore, config: EnginesBenchConfig) -> dict[str, Any]:
    models = list(config.models) + (["reference_swapper_full"] if config.full else [])
    rows = [row for name in models for row in bench_model(store, name, config)]
    return {
        "machine": {
            "cpu_count": os.cpu_count(),
            "processor": platform.processor() or platform.machine(),
            "threads": config.threads or os.cpu_count(),
            "onnxruntime": _version("onnxruntime"),
            "torch": _version("torch"),
        },
        "runs": config.runs,
        "rows": rows,
        "notes": [
            "latency: one model call at batch 1 on the CPU, after warm-up",
            "quality: against ONNX Runtime FP32 on held-out inputs (detector: sample photos, raw output)",
            "swapper outputs come from an UNTRAINED reference network with random latents",
            "TensorRT engines are not benchmarked here (no GPU)",
        ],
    }


def format_table(result: Mapping[str, Any]) -> str:
    header = ("MODEL", "VARIANT", "SIZE", "P50 MS", "P99 MS", "QUALITY VS FP32")
    lines = [
        (
            row["model"],
            f"{row['backend']} {row['precision']}",
            f"{row['size_mb']:.1f} MB",
            f"{row['latency_ms']['p50']:.2f}",
            f"{row['latency_ms']['p99']:.2f}",
            row["quality_vs_fp32"]["summary"],
        )
        for row in result["rows"]
    ]
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    out = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines]
    machine = result["machine"]
    out.append(
        f"{machine['cpu_count']} CPUs ({machine['processor']}), {machine['threads']} threads per model, "
        f"onnxruntime {machine['onnxruntime']}, torch {machine['torch']}, {result['runs']} runs per variant"
    )
    return "\n".join(out)
