"""Knowledge distillation of the super-resolution (and swap) networks on real face crops.

Data
  `SourceImage`s are RGB photos with face boxes (the CLI finds them with the RetinaFace detector). A
  training pool is drawn from them once: a high-resolution crop (around a face for `face_fraction` of the
  samples, anywhere in the photo otherwise) is augmented (horizontal flip, a small rotation with a slight
  zoom-out, brightness/contrast/saturation jitter), then degraded to the low-resolution input (Gaussian
  blur, a downscale by the model's factor with a random kernel, Gaussian noise, JPEG) or, for held-out
  evaluation sets, only downscaled with area averaging ("clean"). The ground truth never comes from an
  upscale: the crop is taken at the photo's own resolution or below. Sets are split BY IMAGE: the
  held-out photos never give a training crop.

  The teacher is run once over the pool (ONNX Runtime; Real-ESRGAN x4plus costs about 0.2 s per 24-32 px
  input on two cores) and its outputs are stored with it. Augmentation therefore happens before the
  teacher sees the input, so every (input, teacher output) pair is exact.

Loss
  loss = alpha * hard + (1 - alpha) * soft, where
    hard = L1(student, ground truth)  (super-resolution; a swap has no ground truth, so alpha = 0)
    soft = L1(student, teacher) + edge_weight * L1(sobel(student), sobel(teacher))
  The feature term is a fixed-filter gradient loss: horizontal and vertical Sobel responses of every
  colour channel, compared with L1. It needs only the teacher's output, so the teacher can stay an ONNX
  file (any architecture), and it weights edges, which an L1 on pixels underrates.

Training
  Adam with a cosine learning-rate decay to a tenth, gradient-norm clipping, a fixed seed. The batch of
  step k is drawn by a generator seeded with (seed, k), and the model and optimizer state are saved every
  `checkpoint_every` steps (atomically), so a run stopped at any point and resumed from its last
  checkpoint ends with the same weights as a run never stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from engines.atomic import atomic_path
from engines.errors import ModelError
from engines.torchnets import net_from_spec, spec_of

CHECKPOINT = "checkpoint.pt"


# -- data -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceImage:
    """An RGB uint8 photo and the face boxes (x1, y1, x2, y2) found in it."""

    image_id: str
    rgb: np.ndarray
    faces: tuple[tuple[float, float, float, float], ...] = ()


@dataclass(frozen=True)
class Augment:
    flip: bool = True
    max_rotation_deg: float = 8.0
    rotate_probability: float = 0.5
    max_zoom_out: float = 1.25  # the crop may cover up to this much more of the photo, shrunk to fit
    brightness: float = 0.08
    contrast: float = 0.12
    saturation: float = 0.15


NO_AUGMENT = Augment(False, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True)
class Degradation:
    blur_probability: float = 0.7
    blur_sigma: tuple[float, float] = (0.3, 1.5)
    noise_probability: float = 0.5
    noise_sigma: tuple[float, float] = (1.0, 6.0)  # grey levels of 255
    jpeg_probability: float = 0.6
    jpeg_quality: tuple[int, int] = (55, 95)


_KERNELS = (cv2.INTER_AREA, cv2.INTER_CUBIC, cv2.INTER_LINEAR)


@dataclass
class SRSet:
    """lr [N, 3, h, w] and hr [N, 3, s*h, s*w] float32 RGB in 0..1, the photo of every item, and the
    teacher's output on lr once computed."""

    lr: np.ndarray
    hr: np.ndarray
    image_ids: np.ndarray
    teacher: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.lr.shape[0])

    def subset(self, index: np.ndarray) -> SRSet:
        teacher = None if self.teacher is None else self.teacher[index]
        return SRSet(self.lr[index], self.hr[index], self.image_ids[index], teacher)


def _crop_centre(source: SourceImage, rng: np.random.Generator, face_fraction: float, extent: float) -> np.ndarray:
    """The centre of a crop of side `extent`: near a face, or anywhere it fits."""
    h, w = source.rgb.shape[:2]
    half = extent / 2
    if source.faces and rng.random() < face_fraction:
        x1, y1, x2, y2 = source.faces[int(rng.integers(len(source.faces)))]
        size = max(x2 - x1, y2 - y1)
        centre = np.array([(x1 + x2) / 2, (y1 + y2) / 2]) + rng.uniform(-0.25, 0.25, 2) * size
    else:
        centre = rng.uniform([half, half], [max(half, w - half), max(half, h - half)])
    return np.clip(centre, [half, half], [max(half, w - half), max(half, h - half)])


def sample_crop(
    source: SourceImage,
    size: int,
    rng: np.random.Generator,
    *,
    augment: Augment = NO_AUGMENT,
    face_fraction: float = 0.75,
) -> np.ndarray:
    """One augmented RGB uint8 crop of `size` x `size` pixels, never upscaled from the photo."""
    h, w = source.rgb.shape[:2]
    if min(h, w) < size:
        raise ModelError(f"photo {source.image_id} is {w}x{h}, smaller than a {size} px crop")
    zoom = rng.uniform(1.0, min(augment.max_zoom_out, min(h, w) / size))
    angle = 0.0
    if augment.max_rotation_deg > 0 and rng.random() < augment.rotate_probability:
        angle = rng.uniform(-augment.max_rotation_deg, augment.max_rotation_deg)
    # A rotated window needs room for its corners; shrink the angle's reach by keeping the window inside.
    reach = size * zoom * (abs(math.cos(math.radians(angle))) + abs(math.sin(math.radians(angle))))
    reach = min(reach, min(h, w))
    cx, cy = _crop_centre(source, rng, face_fraction, reach)
    if angle == 0.0:
        # No rotation: cut the window and shrink it with area averaging (no interpolation blur at zoom 1).
        side = min(round(size * zoom), h, w)
        x0 = int(np.clip(round(cx - side / 2), 0, w - side))
        y0 = int(np.clip(round(cy - side / 2), 0, h - side))
        crop = source.rgb[y0 : y0 + side, x0 : x0 + side]
        if side != size:
            crop = cv2.resize(crop, (size, size), interpolation=cv2.INTER_AREA)
    else:
        matrix = cv2.getRotationMatrix2D((float(cx), float(cy)), angle, 1.0 / zoom)
        matrix[:, 2] += np.array([size / 2 - cx, size / 2 - cy])
        crop = cv2.warpAffine(
            source.rgb, matrix, (size, size), flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT_101
        )
    if augment.flip and rng.random() < 0.5:
        crop = crop[:, ::-1]
    return _jitter(np.ascontiguousarray(crop), rng, augment)


def _jitter(crop: np.ndarray, rng: np.random.Generator, augment: Augment) -> np.ndarray:
    if augment.brightness == augment.contrast == augment.saturation == 0:
        return crop
    x = crop.astype(np.float32) / 255.0
    x = x + rng.uniform(-augment.brightness, augment.brightness)
    mean = x.mean()
    x = (x - mean) * (1.0 + rng.uniform(-augment.contrast, augment.contrast)) + mean
    grey = x.mean(axis=2, keepdims=True)
    x = (x - grey) * (1.0 + rng.uniform(-augment.saturation, augment.saturation)) + grey
    return np.asarray(np.clip(np.rint(x * 255.0), 0, 255), np.uint8)


def degrade(hr: np.ndarray, scale: int, rng: np.random.Generator, degradation: Degradation | None) -> np.ndarray:
    """RGB uint8 [S, S, 3] -> float32 RGB 0..1 [S/scale, S/scale, 3]. None: a clean area downscale."""
    size = hr.shape[0] // scale
    if degradation is None:
        small = cv2.resize(hr, (size, size), interpolation=cv2.INTER_AREA)
        return np.asarray(small, np.float32) / 255.0
    x = hr.astype(np.float32)
    if rng.random() < degradation.blur_probability:
        sigma = rng.uniform(*degradation.blur_sigma)
        x = np.asarray(
            cv2.GaussianBlur(x, (0, 0), sigmaX=sigma, sigmaY=sigma, borderType=cv2.BORDER_REFLECT_101), np.float32
        )
    x = np.asarray(cv2.resize(x, (size, size), interpolation=_KERNELS[int(rng.integers(len(_KERNELS)))]), np.float32)
    if rng.random() < degradation.noise_probability:
        x = x + rng.normal(0.0, rng.uniform(*degradation.noise_sigma), x.shape).astype(np.float32)
    small = np.clip(np.rint(x), 0, 255).astype(np.uint8)
    if rng.random() < degradation.jpeg_probability:
        quality = int(rng.integers(degradation.jpeg_quality[0], degradation.jpeg_quality[1] + 1))
        ok, encoded = cv2.imencode(".jpg", small[:, :, ::-1], [cv2.IMWRITE_JPEG_QUALITY, quality])
        if not ok:
            raise ModelError("JPEG encoding failed while degrading a training crop")
        decoded = cv2.imdecode(encoded, cv2.IMREAD_COLOR)
        if decoded is None:
            raise ModelError("JPEG decoding failed while degrading a training crop")
        small = decoded[:, :, ::-1]
    return np.asarray(small, np.float32) / 255.0


def make_sr_set(
    sources: Sequence[SourceImage],
    count: int,
    *,
    lr_size: int,
    scale: int,
    seed: int,
    augment: Augment = NO_AUGMENT,
    degradation: Degradation | None = None,
    face_fraction: float = 0.75,
) -> SRSet:
    """`count` (lr, hr) pairs drawn evenly from `sources` (round robin over the photos)."""
    if not sources:
        raise ModelError("no photos to draw training crops from")
    rng = np.random.default_rng(seed)
    lrs, hrs, ids = [], [], []
    for i in range(count):
        source = sources[i % len(sources)]
        hr = sample_crop(source, lr_size * scale, rng, augment=augment, face_fraction=face_fraction)
        lrs.append(degrade(hr, scale, rng, degradation).transpose(2, 0, 1))
        hrs.append(hr.transpose(2, 0, 1).astype(np.float32) / 255.0)
        ids.append(source.image_id)
    return SRSet(np.stack(lrs), np.stack(hrs), np.array(ids))


def split_by_image(
    sources: Sequence[SourceImage], heldout: Sequence[str]
) -> tuple[list[SourceImage], list[SourceImage]]:
    """(training photos, held-out photos): whole photos go to one side only."""
    names = {s.image_id for s in sources}
    unknown = set(heldout) - names
    if unknown:
        raise ModelError(f"held-out photos {sorted(unknown)} are not among the sources ({', '.join(sorted(names))})")
    train = [s for s in sources if s.image_id not in heldout]
    test = [s for s in sources if s.image_id in heldout]
    if not train or not test:
        raise ModelError("the split by image needs at least one training and one held-out photo")
    return train, test


def save_set(path: Path, data: SRSet, meta: Mapping[str, Any] | None = None) -> Path:
    """Write the set (and its teacher outputs) to an .npz file atomically."""
    arrays: dict[str, Any] = {"lr": data.lr, "hr": data.hr, "image_ids": data.image_ids}
    if data.teacher is not None:
        arrays["teacher"] = data.teacher
    if meta:
        arrays["meta"] = np.array(repr(dict(meta)))
    path = Path(path)
    with atomic_path(path, suffix=".npz") as tmp:  # numpy appends .npz to a name without it
        np.savez(tmp, **arrays)
    return path


def load_set(path: Path) -> SRSet:
    try:
        with np.load(path) as f:
            teacher = f["teacher"] if "teacher" in f.files else None
            return SRSet(f["lr"], f["hr"], f["image_ids"], teacher)
    except (OSError, KeyError, ValueError) as exc:
        raise ModelError(f"cannot read the data set {path}: {exc}") from None


# -- teacher --------------------------------------------------------------------------------------------


def onnx_session(path: Path, threads: int = 2, *, spin: bool = False) -> ort.InferenceSession:
    """A CPU session. Without `spin`, idle worker threads sleep instead of spinning (kinder to a shared
    CPU, at a small cost in latency); latency measurements keep ONNX Runtime's default spinning."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if not spin:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    try:
        return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # ORT raises several unrelated types for unreadable graphs
        raise ModelError(f"cannot load model {path}: {exc}") from None


def run_teacher(
    path: Path,
    feeds: Mapping[str, np.ndarray],
    *,
    batch: int = 4,
    threads: int = 2,
    progress: bool = True,
    desc: str = "teacher",
) -> np.ndarray:
    """The model's first output over `feeds` (arrays with a common leading axis), `batch` items per call
    (one at a time for a graph with a fixed batch of 1). Feeds are matched to the graph's inputs by name
    when the names agree, by position otherwise."""
    session = onnx_session(Path(path), threads)
    first = session.get_inputs()[0].shape[0]
    step = 1 if first == 1 else batch
    names = [i.name for i in session.get_inputs()]
    if len(feeds) != len(names):
        raise ModelError(f"{Path(path).name} takes inputs {names}; got {list(feeds)}")
    values = [feeds[n] for n in names] if set(feeds) == set(names) else list(feeds.values())
    total = values[0].shape[0]
    outs = []
    for start in tqdm(range(0, total, step), desc=desc, disable=not progress, leave=False):
        chunk = {
            n: np.ascontiguousarray(v[start : start + step], np.float32) for n, v in zip(names, values, strict=True)
        }
        outs.append(np.asarray(session.run(None, chunk)[0], np.float32))
    return np.concatenate(outs)


# -- training -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistillConfig:
    steps: int = 500
    batch: int = 8
    lr: float = 2e-4
    alpha: float = 0.3  # weight of the ground-truth term (0 when there is no ground truth)
    edge_weight: float = 0.5  # weight of the Sobel term inside the soft loss
    seed: int = 0
    checkpoint_every: int = 50
    grad_clip: float = 1.0
    threads: int = 2

    def lr_at(self, step: int) -> float:
        """Cosine decay from `lr` to `lr / 10` over the run."""
        progress = min(1.0, step / max(1, self.steps))
        return self.lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


@dataclass
class TrainData:
    """Student inputs (each with the items on the leading axis), the teacher's outputs and, when there is
    one, the ground truth."""

    inputs: tuple[np.ndarray, ...]
    soft: np.ndarray
    hard: np.ndarray | None = None

    def __len__(self) -> int:
        return int(self.soft.shape[0])


@dataclass
class DistillResult:
    net: nn.Module
    losses: list[tuple[int, float]] = field(default_factory=list)
    resumed_from: int = 0


_SOBEL_X = torch.tensor([[-1.0, 0.0, 1.0], [-2.0, 0.0, 2.0], [-1.0, 0.0, 1.0]]) / 8.0


def sobel(x: torch.Tensor) -> torch.Tensor:
    """Horizontal and vertical Sobel responses of every channel, [N, 2C, H-2, W-2]."""
    channels = x.shape[1]
    kernel = torch.stack([_SOBEL_X, _SOBEL_X.t()])[:, None].repeat(channels, 1, 1, 1).to(x.dtype)
    return F.conv2d(x, kernel, groups=channels)


def distill_loss(
    out: torch.Tensor, soft: torch.Tensor, hard: torch.Tensor | None, config: DistillConfig
) -> torch.Tensor:
    soft_term = F.l1_loss(out, soft) + config.edge_weight * F.l1_loss(sobel(out), sobel(soft))
    if hard is None or config.alpha == 0:
        return soft_term
    return config.alpha * F.l1_loss(out, hard) + (1.0 - config.alpha) * soft_term


def _batch_of(
    data: TrainData, step: int, config: DistillConfig
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor | None]:
    rng = np.random.default_rng([config.seed, step])
    index = rng.choice(len(data), size=min(config.batch, len(data)), replace=False)

    def tensor(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a[index], np.float32))
        return t.contiguous(memory_format=torch.channels_last) if t.dim() == 4 else t

    hard = None if data.hard is None else tensor(data.hard)
    return [tensor(a) for a in data.inputs], tensor(data.soft), hard


def _save_checkpoint(path: Path, payload: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(payload, tmp)


def load_checkpoint(path: Path) -> dict[str, Any]:
    try:
        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
    except (OSError, RuntimeError, EOFError) as exc:
        raise ModelError(f"cannot read the checkpoint {path}: {exc}") from None
    return payload


def distill(
    student: nn.Module,
    data: TrainData,
    config: DistillConfig,
    workdir: Path,
    *,
    resume: bool = True,
    progress: bool = True,
    on_step: Callable[[int, float], None] | None = None,
) -> DistillResult:
    """Train `student` towards the teacher outputs in `data`; checkpoints go to `workdir/checkpoint.pt`.

    With `resume` and a checkpoint present (same network shape and configuration), training continues
    from it; otherwise it starts from `student`'s weights. `on_step(step, loss)` runs after every step."""
    torch.set_num_threads(config.threads)
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ckpt_path = workdir / CHECKPOINT
    spec = spec_of(student)
    net = student.to(memory_format=torch.channels_last)
    optimizer = torch.optim.Adam(net.parameters(), lr=config.lr)
    losses: list[tuple[int, float]] = []
    start = 0
    if resume and ckpt_path.is_file():
        saved = load_checkpoint(ckpt_path)
        if saved.get("spec") != spec or saved.get("config") != asdict(config):
            raise ModelError(
                f"the checkpoint in {workdir} was made with another network or configuration; "
                "use another output folder or start over without resuming"
            )
        net.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        losses = [(int(s), float(v)) for s, v in saved["losses"]]
        start = int(saved["step"])

    def checkpoint(step: int) -> None:
        _save_checkpoint(
            ckpt_path,
            {
                "step": step,
                "spec": spec,
                "config": asdict(config),
                "model": net.state_dict(),
                "optimizer": optimizer.state_dict(),
                "losses": losses,
            },
        )

    net.train()
    bar = tqdm(range(start, config.steps), desc="distill", disable=not progress, initial=start, total=config.steps)
    for step in bar:
        for group in optimizer.param_groups:
            group["lr"] = config.lr_at(step)
        inputs, soft, hard = _batch_of(data, step, config)
        loss = distill_loss(net(*inputs), soft, hard, config)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(net.parameters(), config.grad_clip)
        optimizer.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            raise ModelError(f"distillation diverged at step {step + 1} (loss {value}); lower the learning rate")
        losses.append((step + 1, value))
        bar.set_postfix(loss=f"{value:.4f}")
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == config.steps:
            checkpoint(step + 1)
        if on_step is not None:
            on_step(step + 1, value)
    net.eval()
    return DistillResult(net.to(memory_format=torch.contiguous_format), losses, start)


def save_student(path: Path, net: nn.Module, meta: Mapping[str, Any] | None = None) -> Path:
    """Weights and shape of a trained network, loadable with `load_student`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _save_checkpoint(path, {"spec": spec_of(net), "model": net.state_dict(), "meta": dict(meta or {})})
    return path


def load_student(path: Path) -> nn.Module:
    saved = load_checkpoint(Path(path))
    if "spec" not in saved or "model" not in saved:
        raise ModelError(f"{path} is not a swapcast network file (no spec or weights)")
    net = net_from_spec(saved["spec"])
    net.load_state_dict(saved["model"])
    return net.eval()


def sr_train_data(data: SRSet) -> TrainData:
    if data.teacher is None:
        raise ModelError("the data set has no teacher outputs; build it with a teacher")
    return TrainData((data.lr,), data.teacher, data.hr)


def mean_loss(net: nn.Module, data: TrainData, config: DistillConfig, batch: int = 8) -> float:
    """The distillation loss over all of `data`, without training (to compare before and after)."""
    net.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for start in range(0, len(data), batch):
            sl = slice(start, start + batch)
            inputs = [torch.from_numpy(np.ascontiguousarray(a[sl], np.float32)) for a in data.inputs]
            soft = torch.from_numpy(np.ascontiguousarray(data.soft[sl], np.float32))
            hard = None if data.hard is None else torch.from_numpy(np.ascontiguousarray(data.hard[sl], np.float32))
            n = soft.shape[0]
            total += float(distill_loss(net(*inputs), soft, hard, config)) * n
            count += n
    return total / max(count, 1)
