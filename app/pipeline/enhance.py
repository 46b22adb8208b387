"""Face super-resolution with Real-ESRGAN on the swapped crop, blended with a plain upscale."""

from dataclasses import dataclass

import cv2
import numpy as np

from app.pipeline.stage import DEFAULT_SESSION, ModelStage
from app.pipeline.types import Image
from app.runtime.model import Model


@dataclass(frozen=True)
class EnhanceConfig:
    blend: float = 1.0  # 1 = all super-resolved, 0 = plain bicubic upscale


class RealEsrganEnhancer(ModelStage):
    """Stage: square crops (same size) -> crops `scale` times larger."""

    name = "enhance"

    def __init__(self, model: Model, scale: int, config: EnhanceConfig | None = None) -> None:
        super().__init__(model)
        self.scale = scale
        self.config = config or EnhanceConfig()

    def process(self, batch: list[Image], *, session: str = DEFAULT_SESSION) -> list[Image]:
        if not batch:
            return []
        rgb = np.stack(batch)[..., ::-1].astype(np.float32) / 255.0
        (out,) = self.model.run({self.model.input_names[0]: np.ascontiguousarray(rgb.transpose(0, 3, 1, 2))})
        upscaled = np.clip(out.transpose(0, 2, 3, 1)[..., ::-1] * 255.0, 0, 255)
        results = []
        for crop, sr in zip(batch, upscaled, strict=True):
            if self.config.blend < 1:
                size = (sr.shape[1], sr.shape[0])
                plain = cv2.resize(crop, size, interpolation=cv2.INTER_CUBIC).astype(np.float32)
                sr = plain + self.config.blend * (sr - plain)
            results.append(np.ascontiguousarray(np.rint(sr).astype(np.uint8)))
        return results
