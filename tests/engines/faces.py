"""Real face crops shaped as network input for the supply-chain tests."""

import cv2
import numpy as np

from app.media.clips import load_sample

# The astronaut's face in scikit-image's 512x512 photo (rows, cols).
FACE = (slice(60, 188), slice(154, 282))


def face_batch(size: int) -> np.ndarray:
    """Two real faces (the astronaut, Tom Hanks) shrunk to size x size, [2, 3, size, size] RGB 0..1."""
    crops = [load_sample("astronaut")[FACE], load_sample("tom_hanks")]
    out = [cv2.resize(c, (size, size), interpolation=cv2.INTER_AREA)[:, :, ::-1] for c in crops]
    return np.stack([o.transpose(2, 0, 1) for o in out]).astype(np.float32) / 255.0
