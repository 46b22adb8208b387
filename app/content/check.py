"""`ContentCheck`: Yahoo's Open NSFW classifier (engines.importers.open_nsfw) on BGR images, in batches.

Each image is prepared as the network was trained (the original Caffe deployment, which the package reproduces):
a 256x256 bilinear resize of the RGB image, a JPEG round trip (the network learnt JPEG artefacts; skipping it moves
scores by a few percent), the centre 224x224 crop, BGR order, minus the training means (104, 117, 123). The graph
answers [N,2] softmax; column 1 is the probability the image is sexually explicit.
"""

import io
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from PIL import Image as PILImage

from app.pipeline.types import Image
from app.runtime.model import Model
from app.runtime.onnx import OnnxModel
from engines.store import ModelStore

MODEL_NAME = "open_nsfw"
RESIZE = 256
CROP = 224
MEAN_BGR = np.array([104.0, 117.0, 123.0], np.float32)
EXPLICIT = 1  # the output column of the explicit class (0: safe)


def prepare(image: Image) -> np.ndarray:
    """One BGR uint8 image as the network's [224,224,3] float32 input."""
    rgb = PILImage.fromarray(cv2.cvtColor(np.ascontiguousarray(image), cv2.COLOR_BGR2RGB))
    resized = rgb.resize((RESIZE, RESIZE), resample=PILImage.Resampling.BILINEAR)
    buffer = io.BytesIO()
    resized.save(buffer, format="JPEG")  # Pillow's default quality, as the reference deployment
    buffer.seek(0)
    with PILImage.open(buffer) as decoded:
        pixels = np.asarray(decoded.convert("RGB"), np.float32)
    top = (RESIZE - CROP) // 2
    crop = pixels[top : top + CROP, top : top + CROP, ::-1]
    return crop - MEAN_BGR


class ContentRefused(Exception):
    """An image the check flagged. `score` is for the operator (the audit log, an admin caller), never echoed to
    anyone else; `photo` is the 1-based number of the flagged upload, where there were several."""

    def __init__(self, score: float, threshold: float, photo: int | None = None) -> None:
        super().__init__(f"content flagged (score {score:.4f} >= {threshold})")
        self.score = score
        self.threshold = threshold
        self.photo = photo


class ContentCheck:
    """Scores images for sexually explicit content (0 safe .. 1 explicit) and judges them against a threshold.
    Blocking: run it in an executor or a batcher's worker, never on the event loop."""

    def __init__(self, model: Model, threshold: float) -> None:
        self.model = model
        self.threshold = threshold
        self._input = model.input_names[0]

    def scores(self, images: Sequence[Image]) -> np.ndarray:
        """One score per image, in one batch."""
        if not images:
            return np.empty(0, np.float32)
        batch = np.stack([prepare(image) for image in images])
        (probabilities,) = self.model.run({self._input: batch})[:1]
        return np.asarray(probabilities, np.float32)[:, EXPLICIT]

    def flagged(self, score: float) -> bool:
        return score >= self.threshold

    def close(self) -> None:
        self.model.close()


def load_content_check(store: ModelStore, threshold: float, threads: int = 1, path: Path | None = None) -> ContentCheck:
    """The classifier (imported from its package on first use), or the ONNX file at `path` with the same inputs
    and outputs. It always runs as the FP32 ONNX graph its threshold was measured with."""
    model_path = path if path is not None else store.ensure(MODEL_NAME)
    return ContentCheck(OnnxModel(model_path, threads=threads), threshold)
