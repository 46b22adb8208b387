"""Calibration data for INT8 variants and TensorRT engines, made from real face photos with our own
detector and aligner, in exactly the form each model sees in the pipeline.

Frames: the face photos installed packages ship (`app.media.clips.sample_faces`: insightface's t1 group
photo and Tom Hanks, scikit-image's astronaut, ...), their mirror images, then frames of motion clips
made from them (pan, zoom, roll, per-frame jitter and sensor-like noise at 640x480), interleaved so that
the first N frames already mix every photo.

* detector: each frame letterboxed onto a size x size canvas, BGR minus the training mean, NCHW (as
  RetinaFaceDetector does with a fixed canvas);
* swapper: every face the FP32 detector finds (landmarks refined), aligned to arcface_128 at the
  swapper's size, RGB in [0, 1], NCHW, paired with the identity latent of ANOTHER face (a swap puts one
  person on another): normed ArcFace embedding from the given recognizer, through the swapper's emap,
  renormalised, as InswapperEngine prepares it. Without a recognizer the latents are random unit
  vectors (seeded), and the set's `source` says so;
* enhancer: the same aligned face crops (the enhancer works on swapped crops), RGB in [0, 1], NCHW;
* recognizer: crops aligned to its template (arcface_112_v2 at 112 px), RGB, (x - 127.5) / 127.5.

`calibration_set` caches the result beside the model (`<stem>.calibration.npz`) and makes it again only
when the recipe changes or more samples are asked for.
"""

from __future__ import annotations

import logging
from pathlib import Path

import cv2
import numpy as np
import onnx

from app.errors import ModelError, UserError
from app.media.clips import load_sample, make_motion_clip, sample_faces
from app.pipeline.align import AlignSpec, align_faces
from app.pipeline.detect import BGR_MEAN, DetectorConfig, RetinaFaceDetector
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.swap import last_initializer
from app.pipeline.types import Face, Image
from app.runtime.onnx import OnnxModel
from engines.precision.int8 import CalibrationSet
from engines.registry import get_entry
from engines.store import ModelStore

log = logging.getLogger(__name__)

DETECTOR_MODEL = "retinaface_mnet025"
CLIP_SIZE = (640, 480)
CLIP_FRAMES = 6
DEFAULT_SAMPLES = {"detector": 32, "swapper": 64, "enhancer": 32, "recognizer": 32}


def calibration_frames(count: int, seed: int = 0, *, photos_first: bool = True) -> list[Image]:
    """`count` BGR frames: the sample photos and their mirror images (unless not `photos_first`), then
    motion-clip frames of each photo (another `seed`, other clips: held-out frames for evaluation)."""
    names = sorted(sample_faces())
    if not names:
        raise UserError("no face photos are installed for calibration: bash scripts/setup-dev.sh (insightface)")
    photos = [load_sample(name) for name in names]
    frames: list[Image] = []
    if photos_first:
        frames = [*photos, *(np.asarray(cv2.flip(p, 1), np.uint8) for p in photos)]
    round_ = 0
    while len(frames) < count:
        clips = [
            make_motion_clip(
                photo,
                size=CLIP_SIZE,
                frames=CLIP_FRAMES,
                jitter_px=2.0,
                noise_sigma=2.0,
                seed=seed + 97 * round_ + index,
            ).frames
            for index, photo in enumerate(photos)
        ]
        for step in range(CLIP_FRAMES):  # interleaved: every photo early on
            frames.extend(clip[step] for clip in clips)
        round_ += 1
    return frames[:count]


def letterbox(frame: Image, size: int) -> np.ndarray:
    """[1, 3, size, size] float32: the frame scaled to fit, top-left, BGR minus the mean, zeros elsewhere."""
    scale = size / max(frame.shape[0], frame.shape[1])
    h, w = round(frame.shape[0] * scale), round(frame.shape[1] * scale)
    resized = frame if (h, w) == frame.shape[:2] else cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA)
    canvas = np.zeros((size, size, 3), np.float32)
    canvas[:h, :w] = resized.astype(np.float32) - BGR_MEAN
    return np.ascontiguousarray(canvas.transpose(2, 0, 1)[None])


def detector_set(name: str, model_path: Path, samples: int, size: int = 640) -> CalibrationSet:
    frames = calibration_frames(samples)
    input_name = _input_names(model_path)[0]
    data = tuple({input_name: letterbox(frame, size)} for frame in frames)
    return CalibrationSet(name, data, f"detector: {samples} frames letterboxed to {size}x{size}, BGR minus mean")


def face_crops(
    detector: RetinaFaceDetector,
    count: int,
    size: int,
    frames: list[Image] | None = None,
    template: str = "arcface_128",
) -> list[tuple[Image, Image, Face]]:
    """Up to `count` crops aligned to `template` at `size` px as (crop BGR, source frame, the face in it).

    Frames (default: `calibration_frames`) are taken until enough faces were found."""
    spec = AlignSpec(template, size)
    crops: list[tuple[Image, Image, Face]] = []
    frames = frames if frames is not None else calibration_frames(max(8, count * 8))
    for frame in frames:
        (faces,) = detector.process([frame])
        for aligned in align_faces([frame], [faces], spec):
            crops.append((aligned.crop, frame, aligned.face))
        if len(crops) >= count:
            break
    if not crops:
        raise UserError("the detector found no face in the calibration photos")
    return crops[:count]


def _rgb_nchw(crop: Image) -> np.ndarray:
    return np.ascontiguousarray((crop[..., ::-1].astype(np.float32) / 255.0).transpose(2, 0, 1)[None])


def _input_names(path: Path) -> list[str]:
    model = onnx.load(str(path), load_external_data=False)
    initializers = {init.name for init in model.graph.initializer}
    return [value.name for value in model.graph.input if value.name not in initializers]


def swapper_set(
    name: str,
    model_path: Path,
    detector: RetinaFaceDetector,
    samples: int,
    recognizer: ArcFaceRecognizer | None,
    seed: int = 0,
) -> CalibrationSet:
    target_name, source_name = _input_names(model_path)[:2]
    size = get_entry(name).input_size or (128, 128)
    crops = face_crops(detector, samples, size[0])
    rng = np.random.default_rng(seed)
    if recognizer is not None:
        emap = last_initializer(model_path)
        embeddings = [recognizer.embed(frame, face) for _, frame, face in crops]
        latents = []
        for embedding in embeddings:
            normed = embedding / max(float(np.linalg.norm(embedding)), 1e-12)
            latent = normed @ emap
            latents.append((latent / max(float(np.linalg.norm(latent)), 1e-12)).astype(np.float32))
        # Another face's identity for each target (a swap puts one person on another).
        shift = max(1, len(latents) // 2) if len(latents) > 1 else 0
        paired = [latents[(i + shift) % len(latents)] for i in range(len(latents))]
        how = "identity latents of other faces (recognizer embedding through emap)"
    else:
        paired = []
        for _ in crops:
            vector = rng.standard_normal(512).astype(np.float32)
            paired.append(vector / np.linalg.norm(vector))
        how = "random unit latents (no recognizer given)"
    data = tuple(
        {target_name: _rgb_nchw(crop), source_name: latent[None].astype(np.float32)}
        for (crop, _, _), latent in zip(crops, paired, strict=True)
    )
    return CalibrationSet(name, data, f"swapper: {len(data)} arcface_128 crops at {size[0]} px; {how}")


def enhancer_set(
    name: str, model_path: Path, detector: RetinaFaceDetector, samples: int, size: int = 128
) -> CalibrationSet:
    input_name = _input_names(model_path)[0]
    crops = face_crops(detector, samples, size)
    data = tuple({input_name: _rgb_nchw(crop)} for crop, _, _ in crops)
    return CalibrationSet(name, data, f"enhancer: {len(data)} arcface_128 face crops at {size} px, RGB [0,1]")


def recognizer_set(name: str, model_path: Path, detector: RetinaFaceDetector, samples: int) -> CalibrationSet:
    entry = get_entry(name)
    size = (entry.input_size or (112, 112))[0]
    input_name = _input_names(model_path)[0]
    crops = face_crops(detector, samples, size, template=entry.template or "arcface_112_v2")
    data = tuple(
        {input_name: np.ascontiguousarray(((c[..., ::-1].astype(np.float32) - 127.5) / 127.5).transpose(2, 0, 1)[None])}
        for c, _, _ in crops
    )
    return CalibrationSet(name, data, f"recognizer: {len(data)} {entry.template} crops at {size} px, (x-127.5)/127.5")


def calibration_set(
    store: ModelStore,
    name: str,
    model_path: Path,
    samples: int | None = None,
    *,
    recognizer_model: str | None = None,
    detect_size: int = 640,
) -> CalibrationSet:
    """Calibration data for model `name` whose runnable FP32 file is `model_path`, from the cache beside the
    model when it holds this recipe with enough samples, made (and cached) otherwise."""
    entry = get_entry(name)
    count = samples or DEFAULT_SAMPLES[entry.role]
    recipe = f"{entry.role}|size={detect_size}|recognizer={recognizer_model or 'none'}"
    cached = store.files(name).calibration_data
    if cached.is_file():
        try:
            found = CalibrationSet.load(cached)
        except ModelError as exc:  # a damaged cache is made again
            log.warning("ignoring the calibration cache %s: %s", cached, exc)
        else:
            if found.source.startswith(recipe + "|") and len(found) >= count:
                return CalibrationSet(name, found.samples[:count], found.source)
    made = _make(store, name, model_path, count, recognizer_model, detect_size)
    stored = CalibrationSet(name, made.samples, f"{recipe}|{made.source}")
    stored.save(cached)
    return stored


def _make(
    store: ModelStore, name: str, model_path: Path, count: int, recognizer_model: str | None, detect_size: int
) -> CalibrationSet:
    role = get_entry(name).role
    if role == "detector":
        return detector_set(name, model_path, count, detect_size)
    if role not in ("swapper", "enhancer", "recognizer"):
        raise UserError(f"no calibration recipe for {role} models like {name}")
    detector = RetinaFaceDetector(
        OnnxModel(store.ensure(DETECTOR_MODEL)), DetectorConfig(size=detect_size, refine_landmarks=True)
    )
    recognizer = None
    try:
        if role == "swapper":
            if recognizer_model:
                recognizer = ArcFaceRecognizer(OnnxModel(store.ensure(recognizer_model)))
            return swapper_set(name, model_path, detector, count, recognizer)
        if role == "enhancer":
            return enhancer_set(name, model_path, detector, count)
        return recognizer_set(name, model_path, detector, count)
    finally:
        detector.close()
        if recognizer is not None:
            recognizer.close()
