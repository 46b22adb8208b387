"""A smaller swap network distilled from any model with inswapper_128's contract.

The teacher is an ONNX file (inswapper_128, its fp16 export, a reference swapper, an earlier student),
run through ONNX Runtime; the student is `engines.torchnets.Swapper` (the reference layout: encoder,
AdaIN style blocks, decoder) at smaller widths, trained with `engines.distill` on aligned arcface_128
crops of real faces and identity latents. A swap has no ground truth, so the loss is the soft term alone:
L1 to the teacher's output plus the Sobel edge term. The student keeps the teacher's `emap` as its last
initializer and is exported with the same contract (`target`, `source`, `output`), so the pipeline's
InswapperEngine loads it in the teacher's place and computes the same latents for it.

Data: the crops are augmented before the teacher sees them (horizontal flip, a rotation of up to 3
degrees and a shift of up to 2 px about the crop centre with black outside, as the aligner fills, and
colour jitter), and each crop is paired with an identity latent. Latents are drawn as the pipeline makes
them from an embedding: a random unit vector e, then normalise(e @ emap). Pass real embeddings' latents
instead when a recognizer is available; the student only ever sees the latents it is given.

Recommended student size
  inswapper_128's cost sits in its six style blocks at 32x32 with 1024 channels (twelve 3x3 convs of
  about 9.7 GMAC each, two thirds of its 175 GMAC). Halving every width (`SwapperSpec.divided(2)`:
  128/256/512/1024 -> 64/128/256/512, six blocks) cuts MACs four-fold and parameters 3.7-fold (37.7M
  parameters and 43.8 GMAC per face, against 138.3M and 174.6) and is the recommended first student: it
  keeps the layout, so the AdaIN conditioning keeps the same capacity per channel. Go to a quarter of the
  widths (11.0M parameters, 11.0 GMAC) only when latency matters more than fidelity, and drop style
  blocks (4 instead of 6 at half width: 26.2M, 34.1 GMAC) before cutting widths further. These sizes were
  exercised end to end only on the untrained reference swapper (narrow teacher -> half-width student);
  how much of the real model's quality each keeps has not been measured here, so compare any student
  with its teacher (`swapcast engines report`) before using it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from engines.distill import Augment, DistillConfig, DistillResult, TrainData, distill, run_teacher
from engines.errors import ModelError
from engines.export import export_verified, sample_inputs
from engines.torchnets.onnx_weights import OnnxWeights
from engines.torchnets.swapper import CROP, LATENT_DIM, Swapper, SwapperSpec

RECOMMENDED_DIVISOR = 2
SWAP_AUGMENT = Augment(max_rotation_deg=3.0, rotate_probability=1.0, max_zoom_out=1.0)
MAX_SHIFT_PX = 2.0


@dataclass(frozen=True)
class AlignedCrop:
    """An RGB uint8 128x128 crop aligned to the arcface_128 template, and the photo it came from."""

    image_id: str
    rgb: np.ndarray


def teacher_emap(path: Path) -> np.ndarray:
    """The teacher's embedding map: its last initializer, 512x512."""
    emap = OnnxWeights.load(path).last_initializer()
    if emap.shape != (LATENT_DIM, LATENT_DIM):
        raise ModelError(f"{Path(path).name}: last initializer is {emap.shape}, not an inswapper emap (512x512)")
    return emap


def random_latents(count: int, emap: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Latents as the pipeline makes them from embeddings: normalise(normalise(e) @ emap), e random."""
    e = rng.standard_normal((count, LATENT_DIM)).astype(np.float32)
    e /= np.linalg.norm(e, axis=1, keepdims=True)
    latent = e @ emap
    return (latent / np.maximum(np.linalg.norm(latent, axis=1, keepdims=True), 1e-12)).astype(np.float32)


def augment_aligned(crop: np.ndarray, rng: np.random.Generator, augment: Augment = SWAP_AUGMENT) -> np.ndarray:
    """Flip, small rotation and shift about the centre (black outside), colour jitter."""
    angle = rng.uniform(-augment.max_rotation_deg, augment.max_rotation_deg) if augment.max_rotation_deg else 0.0
    matrix = np.asarray(cv2.getRotationMatrix2D((CROP / 2 - 0.5, CROP / 2 - 0.5), angle, 1.0), np.float64)
    matrix[:, 2] = matrix[:, 2] + rng.uniform(-MAX_SHIFT_PX, MAX_SHIFT_PX, 2)
    out = cv2.warpAffine(crop, matrix, (CROP, CROP), flags=cv2.INTER_LINEAR, borderValue=(0, 0, 0))
    if augment.flip and rng.random() < 0.5:
        out = out[:, ::-1]
    x = np.asarray(out, np.float32) / 255.0
    x = x + rng.uniform(-augment.brightness, augment.brightness)
    grey = x.mean(axis=2, keepdims=True)
    x = (x - grey) * (1.0 + rng.uniform(-augment.saturation, augment.saturation)) + grey
    return np.asarray(np.clip(np.rint(x * 255.0), 0, 255), np.uint8)


def make_swap_inputs(
    crops: Sequence[AlignedCrop], count: int, emap: np.ndarray, *, seed: int, augment: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(targets [N, 3, 128, 128] RGB 0..1, latents [N, 512], image ids), round robin over the crops."""
    if not crops:
        raise ModelError("no aligned face crops to train the swap student on")
    for c in crops:
        if c.rgb.shape != (CROP, CROP, 3) or c.rgb.dtype != np.uint8:
            raise ModelError(f"aligned crops must be {CROP}x{CROP} RGB uint8; {c.image_id} is {c.rgb.shape}")
    rng = np.random.default_rng(seed)
    targets, ids = [], []
    for i in range(count):
        crop = crops[i % len(crops)]
        rgb = augment_aligned(crop.rgb, rng) if augment else crop.rgb
        targets.append(rgb.transpose(2, 0, 1).astype(np.float32) / 255.0)
        ids.append(crop.image_id)
    return np.stack(targets), random_latents(count, emap, rng), np.array(ids)


def swap_train_data(
    teacher: Path,
    crops: Sequence[AlignedCrop],
    count: int,
    *,
    seed: int,
    threads: int = 2,
    progress: bool = True,
    augment: bool = True,
) -> TrainData:
    """Inputs and the teacher's outputs for `count` augmented crops with random identity latents."""
    targets, latents, _ = make_swap_inputs(crops, count, teacher_emap(teacher), seed=seed, augment=augment)
    soft = run_teacher(
        teacher, {"target": targets, "source": latents}, threads=threads, progress=progress, desc="swap teacher"
    )
    if soft.shape != targets.shape:
        raise ModelError(f"{Path(teacher).name} returned {soft.shape}, not the inswapper output {targets.shape}")
    return TrainData((targets, latents), soft, None)


def default_student_spec(teacher: Path, divisor: int = RECOMMENDED_DIVISOR, blocks: int | None = None) -> SwapperSpec:
    """The teacher's widths divided by `divisor` when it has the reference layout, else inswapper_128's."""
    try:
        base = Swapper.from_onnx(teacher).spec
    except ModelError:
        base = SwapperSpec.divided(1)
    c1, c2, c3, c4 = (max(1, c // divisor) for c in (base.c1, base.c2, base.c3, base.c4))
    return SwapperSpec(c1, c2, c3, c4, base.blocks if blocks is None else blocks)


def new_student(spec: SwapperSpec, emap: np.ndarray, seed: int = 0) -> Swapper:
    """A student with seeded default initialisation and the teacher's emap."""
    torch.manual_seed(seed)
    net = Swapper(spec)
    with torch.no_grad():
        net.emap.copy_(torch.from_numpy(np.ascontiguousarray(emap, np.float32)))
    return net


def parameter_count(net: torch.nn.Module) -> int:
    return sum(p.numel() for p in net.parameters())


@dataclass
class SwapStudent:
    net: Swapper
    result: DistillResult
    onnx_path: Path
    export_error: float
    teacher_params: int | None


def distill_swapper(
    teacher: Path,
    data: TrainData,
    out_dir: Path,
    *,
    spec: SwapperSpec | None = None,
    config: DistillConfig | None = None,
    resume: bool = True,
    progress: bool = True,
    name: str = "swap_student",
) -> SwapStudent:
    """Train a student on `data` (from `swap_train_data`) and export it to `out_dir/<name>.onnx`."""
    config = config or DistillConfig(alpha=0.0)
    if config.alpha != 0.0:
        raise ModelError("a swap has no ground truth: distil the swap student with alpha = 0")
    spec = spec or default_student_spec(teacher)
    student = new_student(spec, teacher_emap(teacher), config.seed)
    result = distill(student, data, config, Path(out_dir) / f"{name}.work", resume=resume, progress=progress)
    net = result.net
    assert isinstance(net, Swapper)
    feeds = sample_inputs(net, batch=2)
    path = Path(out_dir) / f"{name}.onnx"
    error = export_verified(
        net,
        path,
        feeds=feeds,
        doc=f"swap student distilled from {Path(teacher).name}; inswapper_128 contract",
        metadata={"swapcast.teacher": Path(teacher).name, "swapcast.student": str(spec.to_dict())},
    )
    try:
        teacher_params: int | None = parameter_count(Swapper.from_onnx(teacher))
    except ModelError:
        teacher_params = None
    return SwapStudent(net, result, path, error, teacher_params)


def loss_fell(losses: Sequence[tuple[int, float]], window: int = 5) -> tuple[float, float]:
    """Mean loss of the first and the last `window` steps."""
    values = [v for _, v in losses]
    if not values:
        return math.nan, math.nan
    window = max(1, min(window, len(values) // 2))
    return float(np.mean(values[:window])), float(np.mean(values[-window:]))
