"""Benchmark frames built from real face photos: N faces laid over a real background at 720p or 1080p."""

import cv2
import numpy as np

from app.pipeline.types import Image

RESOLUTIONS = {"720p": (1280, 720), "1080p": (1920, 1080)}


def compose_scene(faces: list[Image], background: Image, size: tuple[int, int], face_height: float = 0.42) -> Image:
    """`faces` (portraits) side by side over `background`, each `face_height` of the frame tall."""
    width, height = size
    frame = cv2.resize(background, (width, height), interpolation=cv2.INTER_AREA)
    frame = cv2.GaussianBlur(frame, (0, 0), 6)
    slot = width // max(1, len(faces))
    for i, portrait in enumerate(faces):
        target_h = int(height * face_height)
        target_w = min(slot - 8, int(portrait.shape[1] * target_h / portrait.shape[0]))
        target_h = int(portrait.shape[0] * target_w / portrait.shape[1])
        resized = cv2.resize(portrait, (target_w, target_h), interpolation=cv2.INTER_AREA)
        x = i * slot + (slot - target_w) // 2
        y = (height - target_h) // 2
        frame[y : y + target_h, x : x + target_w] = resized
    return np.ascontiguousarray(frame)


def jittered(frame: Image, count: int, seed: int = 0) -> list[Image]:
    """`count` frames of a scene, each shifted by a couple of pixels, like a handheld camera."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        dx, dy = rng.uniform(-3, 3, size=2)
        matrix = np.array([[1.0, 0.0, dx], [0.0, 1.0, dy]])
        shifted = cv2.warpAffine(frame, matrix, (frame.shape[1], frame.shape[0]), borderMode=cv2.BORDER_REFLECT)
        out.append(np.asarray(shifted, np.uint8))
    return out
