"""Alignment: fit a similarity transform from 5 landmarks to a template and warp crops.

The templates are the published ones, in coordinates normalised to the crop size. The fit is the Umeyama
least-squares similarity that insightface's alignment uses (scikit-image's `SimilarityTransform` estimate), so
our crops match the ones the swap models were trained on; in the plane it has a closed form (`similarity_fit`),
which every tracked face needs several times a frame.
"""

from dataclasses import dataclass

import cv2
import numpy as np

from app.pipeline.types import AlignedFace, Face, Image, Matrix, Points

TEMPLATES: dict[str, np.ndarray] = {
    "arcface_112_v2": np.array(
        [[0.34191607, 0.46157411], [0.65653393, 0.45983393], [0.50022500, 0.64050536],
         [0.37097589, 0.82469196], [0.63151696, 0.82325089]]
    ),
    "arcface_128": np.array(
        [[0.36167656, 0.40387734], [0.63696719, 0.40235469], [0.50019687, 0.56044219],
         [0.38710391, 0.72160547], [0.61507734, 0.72034453]]
    ),
    "arcface_112_v1": np.array(
        [[0.35473214, 0.45658929], [0.64526786, 0.45658929], [0.50000000, 0.61154464],
         [0.37913393, 0.77687500], [0.62086607, 0.77687500]]
    ),
    # MediaPipe's face mesh ROI: the canonical mesh's five points, frontal, in its landmark box × 1.5
    # (app.pipeline.landmarks.mesh_template computes these from the canonical mesh).
    "face_mesh": np.array(
        [[0.38107872, 0.37940800], [0.61892130, 0.37940800], [0.50000000, 0.52098554],
         [0.40730490, 0.64234495], [0.59269506, 0.64234495]]
    ),
    "ffhq_512": np.array(
        [[0.37691676, 0.46864664], [0.62285697, 0.46912813], [0.50123859, 0.61331904],
         [0.39308822, 0.72541100], [0.61150205, 0.72490465]]
    ),
}  # fmt: skip
# The mesh engine's crop: the face_mesh ROI framed tighter (landmark box × 1.2 instead of × 1.5), so paste-back
# touches 0.64× the pixels; the landmark model still sees its own framing (app.pipeline.landmarks.CropLandmarks).
TEMPLATES["face_mesh_tight"] = (TEMPLATES["face_mesh"] - 0.5) * (1.5 / 1.2) + 0.5


@dataclass(frozen=True)
class AlignSpec:
    """Which template and crop size a model expects."""

    template: str
    size: int

    def __post_init__(self) -> None:
        if self.template not in TEMPLATES:
            raise ValueError(f"unknown alignment template {self.template!r}; known: {', '.join(TEMPLATES)}")


def similarity_fit(source: np.ndarray, destination: np.ndarray) -> Matrix:
    """The 2x3 similarity (rotation, uniform scale, shift; no reflection) that maps `source` points onto
    `destination` with the least squared error: Umeyama's solution, which in the plane is a complex
    least-squares fit, d − d̄ ≈ z·(s − s̄) with z = Σ conj(s − s̄)(d − d̄) / Σ |s − s̄|². Scikit-image's
    general estimator (an SVD and several checks) took 10x as long on five points."""
    src = np.asarray(source, np.float64)
    dst = np.asarray(destination, np.float64)
    src_mean, dst_mean = src.mean(axis=0), dst.mean(axis=0)
    s = (src[:, 0] - src_mean[0]) + 1j * (src[:, 1] - src_mean[1])
    d = (dst[:, 0] - dst_mean[0]) + 1j * (dst[:, 1] - dst_mean[1])
    spread = float(np.vdot(s, s).real)
    if not spread > 1e-12:
        raise ValueError("cannot fit a similarity to points that all coincide")
    z = np.vdot(s, d) / spread  # vdot conjugates its first argument
    a, b = z.real, z.imag
    rotation = np.array([[a, -b], [b, a]])
    return np.hstack([rotation, (dst_mean - rotation @ src_mean)[:, None]])


def estimate_matrix(landmarks: Points, spec: AlignSpec) -> Matrix:
    """2x3 matrix mapping frame coordinates onto the template at `spec.size` pixels."""
    return similarity_fit(landmarks, TEMPLATES[spec.template] * spec.size)


def warp_crop(image: Image, matrix: Matrix, size: int) -> Image:
    # Black outside the frame, as the swap models saw in training (insightface crops the same way).
    crop = cv2.warpAffine(image, matrix, (size, size), flags=cv2.INTER_LINEAR, borderValue=(0, 0, 0))
    return np.asarray(crop, np.uint8)


def align_faces(frames: list[Image], faces: list[list[Face]], spec: AlignSpec) -> list[AlignedFace]:
    """Crops of every face of every frame, flattened in frame order."""
    aligned: list[AlignedFace] = []
    for index, (frame, frame_faces) in enumerate(zip(frames, faces, strict=True)):
        for face in frame_faces:
            matrix = estimate_matrix(face.landmarks, spec)
            aligned.append(AlignedFace(index, face, warp_crop(frame, matrix, spec.size), matrix))
    return aligned


def transform_points(points: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    pts = np.asarray(points, np.float64)
    return pts @ matrix[:, :2].T + matrix[:, 2]
