"""Swap engines behind one interface. Identity preparation (`prepare`) runs once per identity and its
result is cached and shared; `process` swaps a batch of aligned target crops."""

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import onnx
from onnx import numpy_helper

from app.errors import ModelError
from app.pipeline.align import AlignSpec, estimate_matrix, warp_crop
from app.pipeline.color import thumbnail_stats, transfer_color_u8
from app.pipeline.color_hold import ColorHold
from app.pipeline.recognize import ArcFaceRecognizer
from app.pipeline.stage import DEFAULT_SESSION
from app.pipeline.types import Face, Image
from app.runtime.model import Model


@dataclass(frozen=True)
class PreparedSource:
    """What an engine needs of a source identity: a latent vector or a texture."""

    engine: str
    model_key: str
    data: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass
class SwapItem:
    crop: Image
    source: PreparedSource
    mesh: np.ndarray | None = None  # the crop's dense landmarks when the caller tracked them (468×3, crop pixels)
    # Keep the target's own mouth (app.pipeline.mouth), for engines that can: None is the engine's default (the
    # server's setting). Per item, so one shared engine serves streams with and without it.
    keep_mouth: bool | None = None
    # The face's colour statistics as the engine applied them in its previous frames (app.pipeline.color_hold), for
    # engines that match colour themselves; None: matched afresh (a still photo, an untracked face).
    color: ColorHold | None = None


class SwapEngine(Protocol):
    name: str
    align: AlignSpec  # the template and crop size the engine swaps at
    model_key: str  # names the model and version: prepared sources are only valid for the same key

    def prepare(self, image: Image, face: Face) -> PreparedSource: ...

    def process(self, batch: list[SwapItem], *, session: str = DEFAULT_SESSION) -> list[Image]: ...

    def close(self) -> None: ...


def check_sources(engine: SwapEngine, batch: list[SwapItem]) -> None:
    for item in batch:
        if item.source.model_key != engine.model_key:
            raise ValueError(
                f"identity was prepared for {item.source.model_key}, not {engine.model_key}: prepare it again"
            )


def last_initializer(path: Path) -> np.ndarray:
    """inswapper keeps its embedding map `emap` as the graph's last initializer."""
    model = onnx.load(str(path), load_external_data=False)
    if not model.graph.initializer:
        raise ModelError(f"{path.name} has no initializers: not an inswapper-contract model")
    return numpy_helper.to_array(model.graph.initializer[-1]).astype(np.float32)


class InswapperEngine:
    """inswapper_128 and models with its contract: arcface_128 crops in RGB [0,1], latent = emap-projected,
    renormalised ArcFace embedding."""

    name = "inswapper"

    def __init__(self, swapper: Model, recognizer: ArcFaceRecognizer, emap: np.ndarray | None = None) -> None:
        self.swapper = swapper
        self.recognizer = recognizer
        self.emap = last_initializer(swapper.path) if emap is None else emap
        if self.emap.shape != (512, 512):
            raise ModelError(f"{swapper.path.name}: last initializer is {self.emap.shape}, expected emap 512×512")
        size = swapper.input_shape[2]
        self.align = AlignSpec("arcface_128", size if isinstance(size, int) else 128)
        self.model_key = f"inswapper:{swapper.path.name}:{swapper.path.stat().st_size}"

    def close(self) -> None:
        self.swapper.close()
        self.recognizer.close()

    def latent(self, embedding: np.ndarray) -> np.ndarray:
        normed = embedding / max(float(np.linalg.norm(embedding)), 1e-12)
        latent = normed @ self.emap
        return (latent / max(float(np.linalg.norm(latent)), 1e-12)).astype(np.float32)

    def prepare(self, image: Image, face: Face) -> PreparedSource:
        return self.prepare_embedding(self.recognizer.embed(image, face))

    def prepare_embedding(self, embedding: np.ndarray) -> PreparedSource:
        return PreparedSource(self.name, self.model_key, self.latent(embedding))

    def process(self, batch: list[SwapItem], *, session: str = DEFAULT_SESSION) -> list[Image]:
        if not batch:
            return []
        check_sources(self, batch)
        crops = np.stack([item.crop for item in batch])[..., ::-1].astype(np.float32) / 255.0
        latents = np.stack([item.source.data for item in batch])
        names = self.swapper.input_names
        (out,) = self.swapper.run({names[0]: np.ascontiguousarray(crops.transpose(0, 3, 1, 2)), names[1]: latents})
        bgr = np.clip(out.transpose(0, 2, 3, 1) * 255.0, 0, 255).astype(np.uint8)[..., ::-1]
        return [np.ascontiguousarray(face) for face in bgr]


class _ModelFreeEngine:
    """What the engines without a model share: an arcface_128 crop of `size`, a model key naming the engine
    and that size, and nothing to release."""

    name: str

    def __init__(self, size: int) -> None:
        self.align = AlignSpec("arcface_128", size)
        self.model_key = f"{self.name}:{size}"

    def close(self) -> None:
        pass  # no model


class ClassicEngine(_ModelFreeEngine):
    """No-weights fallback: the source face's aligned texture, colour-matched to each target.

    It needs no download and runs anywhere, but it does NOT transfer the target's expression, pose
    details or lighting direction: the source's face is laid over the target as it was photographed.
    """

    name = "classic"

    def __init__(self, size: int = 256) -> None:
        super().__init__(size)

    def prepare(self, image: Image, face: Face) -> PreparedSource:
        texture = warp_crop(image, estimate_matrix(face.landmarks, self.align), self.align.size)
        return PreparedSource(self.name, self.model_key, texture)

    def process(self, batch: list[SwapItem], *, session: str = DEFAULT_SESSION) -> list[Image]:
        check_sources(self, batch)
        out = []
        for item in batch:
            texture = np.asarray(item.source.data, np.uint8)
            out.append(transfer_color_u8(texture, thumbnail_stats(texture), thumbnail_stats(item.crop)))
        return out


class PassthroughEngine(_ModelFreeEngine):
    """Returns each target crop unchanged: measures everything around the model (server cost, paste-back
    fidelity) with a model that costs nothing."""

    name = "passthrough"

    def __init__(self, size: int = 128) -> None:
        super().__init__(size)

    def prepare(self, image: Image, face: Face) -> PreparedSource:
        return PreparedSource(self.name, self.model_key, np.zeros(0, np.float32))

    def process(self, batch: list[SwapItem], *, session: str = DEFAULT_SESSION) -> list[Image]:
        return [item.crop.copy() for item in batch]
