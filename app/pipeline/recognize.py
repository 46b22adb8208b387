"""Identity embeddings from an ArcFace-contract recognizer (112×112 arcface_112_v2 crops, 512-d)."""

import numpy as np

from app.pipeline.align import AlignSpec, estimate_matrix, warp_crop
from app.pipeline.stage import DEFAULT_SESSION, ModelStage
from app.pipeline.types import Face, Image

ARCFACE_ALIGN = AlignSpec("arcface_112_v2", 112)


class ArcFaceRecognizer(ModelStage):
    """Stage: aligned 112×112 crops -> L2-normalised embeddings."""

    name = "recognize"

    def crop(self, image: Image, face: Face) -> Image:
        return warp_crop(image, estimate_matrix(face.landmarks, ARCFACE_ALIGN), ARCFACE_ALIGN.size)

    def process(self, batch: list[Image], *, session: str = DEFAULT_SESSION) -> list[np.ndarray]:
        if not batch:
            return []
        rgb = np.stack(batch)[..., ::-1].astype(np.float32)
        blob = ((rgb - 127.5) / 127.5).transpose(0, 3, 1, 2)
        (embeddings,) = self.model.run({self.model.input_names[0]: np.ascontiguousarray(blob)})
        norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
        return list((embeddings / np.maximum(norms, 1e-12)).astype(np.float32))

    def embed(self, image: Image, face: Face) -> np.ndarray:
        return self.process([self.crop(image, face)])[0]
