"""RetinaFace detection over a batch of frames: letterbox, one model call, prior decoding, NMS.

The decoding is written here rather than taken from a package because the ones on PyPI decode one
image at a time and hard-code thresholds; we need batches of mixed-size frames in one call.
"""

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Literal

import cv2
import numpy as np
from skimage.transform import SimilarityTransform

from app.pipeline.align import TEMPLATES, transform_points
from app.pipeline.stage import DEFAULT_SESSION, ModelStage
from app.pipeline.types import Face, Image
from app.runtime.model import Model

# biubug6 RetinaFace-MobileNet0.25 anchor layout and box-coding variances.
STRIDES = (8, 16, 32)
MIN_SIZES = ((16, 32), (64, 128), (256, 512))
VARIANCES = (0.1, 0.2)
# The network was trained on BGR images minus this per-channel mean, unscaled.
BGR_MEAN = np.array([104.0, 117.0, 123.0], np.float32)


@dataclass(frozen=True)
class DetectorConfig:
    size: int = 640  # the longer side of the detector input
    score_threshold: float = 0.75
    nms_threshold: float = 0.4
    max_faces: int = 64
    # Second pass on each face turned upright (and mirrored): the network's landmarks drift on tilted
    # heads. Costs about two small detector runs per face, so live streams usually leave it off.
    refine_landmarks: bool = False
    refine_size: int = 192
    # "fixed": every frame is letterboxed onto the same canvas, so frames of any shape batch together and
    # a frame's result never depends on its batch-mates (the factory sets it for shared, batched
    # detection). "tight": the smallest canvas (multiple of 32) that holds the batch, which costs less
    # for one wide frame (stills, files, identity uploads).
    canvas: Literal["tight", "fixed"] = "tight"


# Landmark order after a horizontal flip: the eyes swap, and so do the mouth corners.
MIRROR_ORDER = [1, 0, 2, 4, 3]

# Where the refinement pass puts a face in its square crop: the ArcFace template, shrunk to three quarters of the
# crop, so the detector sees the face at a size it was trained on, with context around it.
_REFINE_TEMPLATE = (TEMPLATES["arcface_112_v2"] - 0.5) * 0.75 + 0.5


@lru_cache(maxsize=8)
def priors(height: int, width: int) -> np.ndarray:
    """Anchor centres and sizes in pixels, [A, 4] as cx, cy, w, h, in the network's output order."""
    rows = []
    for stride, sizes in zip(STRIDES, MIN_SIZES, strict=True):
        ny, nx = -(-height // stride), -(-width // stride)
        ys, xs = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
        centres = np.stack([(xs.ravel() + 0.5) * stride, (ys.ravel() + 0.5) * stride], axis=1)
        for_cell = np.repeat(centres, len(sizes), axis=0)
        wh = np.tile(np.array([[s, s] for s in sizes], np.float64), (ny * nx, 1))
        rows.append(np.hstack([for_cell, wh]))
    return np.vstack(rows).astype(np.float32)


def decode(
    loc: np.ndarray, conf: np.ndarray, landmarks: np.ndarray, anchors: np.ndarray, config: DetectorConfig
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One image's raw outputs -> boxes [K,4] x1y1x2y2, scores [K], landmarks [K,5,2] in input pixels."""
    scores = conf[:, 1]
    keep = np.flatnonzero(scores > config.score_threshold)
    if keep.size == 0:
        return np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros((0, 5, 2), np.float32)
    a, loc, lmk, scores = anchors[keep], loc[keep], landmarks[keep], scores[keep]
    centre = a[:, :2] + loc[:, :2] * VARIANCES[0] * a[:, 2:]
    size = a[:, 2:] * np.exp(loc[:, 2:] * VARIANCES[1])
    boxes = np.hstack([centre - size / 2, centre + size / 2])
    points = a[:, None, :2] + lmk.reshape(-1, 5, 2) * VARIANCES[0] * a[:, None, 2:]
    xywh = np.hstack([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]])
    chosen = np.asarray(
        cv2.dnn.NMSBoxes(xywh.tolist(), scores.tolist(), config.score_threshold, config.nms_threshold), np.int64
    ).reshape(-1)[: config.max_faces]
    return boxes[chosen].astype(np.float32), scores[chosen].astype(np.float32), points[chosen].astype(np.float32)


class RetinaFaceDetector(ModelStage):
    """Stage: frames -> faces per frame, in frame coordinates."""

    name = "detect"

    def __init__(self, model: Model, config: DetectorConfig | None = None) -> None:
        super().__init__(model)
        self.config = config or DetectorConfig()

    def _input_size(self, frames: list[Image]) -> tuple[int, int, list[float]]:
        """Common letterbox size (multiple of 32) for the batch and each frame's scale."""
        if self.config.canvas == "fixed":
            # A 4:3 landscape canvas: webcams' 4:3 fills it, 16:9 wastes a fifth of it (a square
            # canvas would waste a quarter and two fifths); portrait frames are fitted by height.
            width = -(-self.config.size // 32) * 32
            height = -(-(self.config.size * 3 // 4) // 32) * 32
            return height, width, [min(width / f.shape[1], height / f.shape[0]) for f in frames]
        scales = [self.config.size / max(f.shape[0], f.shape[1]) for f in frames]
        height = max(round(f.shape[0] * s) for f, s in zip(frames, scales, strict=True))
        width = max(round(f.shape[1] * s) for f, s in zip(frames, scales, strict=True))
        return -(-height // 32) * 32, -(-width // 32) * 32, scales

    def _run(self, blob: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Detector on a BGR-minus-mean NHWC batch; decoded boxes, scores and landmarks per image."""
        loc, conf, lmk = self.model.run({self.model.input_names[0]: blob.transpose(0, 3, 1, 2)})
        anchors = priors(blob.shape[1], blob.shape[2])
        return [decode(loc[i], conf[i], lmk[i], anchors, self.config) for i in range(blob.shape[0])]

    def process(self, batch: list[Image], *, session: str = DEFAULT_SESSION) -> list[list[Face]]:
        if not batch:
            return []
        height, width, scales = self._input_size(batch)
        blob = np.zeros((len(batch), height, width, 3), np.float32)
        for i, (frame, scale) in enumerate(zip(batch, scales, strict=True)):
            h, w = max(1, round(frame.shape[0] * scale)), max(1, round(frame.shape[1] * scale))
            resized = frame if (h, w) == frame.shape[:2] else cv2.resize(frame, (w, h), interpolation=cv2.INTER_AREA)
            blob[i, :h, :w] = resized.astype(np.float32) - BGR_MEAN
        results = [
            [Face(box=b / scale, score=float(s), landmarks=p / scale) for b, s, p in zip(*found, strict=True)]
            for found, scale in zip(self._run(blob), scales, strict=True)
        ]
        if self.config.refine_landmarks:
            self._refine(batch, results)
        return results

    def _refine(self, frames: list[Image], results: list[list[Face]]) -> None:
        """Detect each face again, turned upright in a small crop, and keep those landmarks (in place)."""
        jobs = [(i, j) for i, faces in enumerate(results) for j in range(len(faces))]
        if not jobs:
            return
        size = self.config.refine_size
        template = _REFINE_TEMPLATE * size
        matrices = []
        blob = np.empty((len(jobs), size, size, 3), np.float32)
        for k, (i, j) in enumerate(jobs):
            source = results[i][j].landmarks.astype(np.float64)
            matrix = SimilarityTransform.from_estimate(source, template).params[:2]
            matrices.append(matrix)
            crop = cv2.warpAffine(frames[i], matrix, (size, size), flags=cv2.INTER_LINEAR, borderValue=(0, 0, 0))
            blob[k] = crop.astype(np.float32) - BGR_MEAN
        # The mirrored crop too: averaging a face with its mirror image cancels the network's left/right bias.
        passes = self._run(np.concatenate([blob, blob[:, :, ::-1]]))
        centre = template.mean(axis=0)
        for k, ((i, j), matrix) in enumerate(zip(jobs, matrices, strict=True)):
            upright, mirrored = passes[k][2], passes[k + len(jobs)][2]
            if len(upright) == 0 or len(mirrored) == 0:
                continue  # the upright crop lost the face: keep the first pass
            points = upright[np.argmin(np.linalg.norm(upright.mean(axis=1) - centre, axis=1))]
            flipped = mirrored[:, MIRROR_ORDER].copy()
            flipped[..., 0] = size - flipped[..., 0]
            other = flipped[np.argmin(np.linalg.norm(flipped.mean(axis=1) - centre, axis=1))]
            refined = transform_points((points + other) / 2, cv2.invertAffineTransform(matrix)).astype(np.float32)
            results[i][j] = replace(results[i][j], landmarks=refined)
