"""Dense landmarks followed from frame to frame, as MediaPipe's face mesh is meant to run.

Each tracked face's 468 points are found on a crop framed by that face's own points in the previous frame
(their five points aligned on the model's ROI template, one model pass), not by the box tracker's prediction:
the tracker's Kalman points and the mesh's five points differ by 0.03-0.09 eye distances on the same face, so
switching between them would make the swapped face jump at every detection. The tracker still decides which
faces exist (detections, entries, exits, the face-lost policy); the mesh only says where each one is.

A face's chain restarts from the tracker's points when there is none yet, when the two disagree by more than
`max_disagreement` eye distances (the detector found the face somewhere else: it jumped, or the chain
drifted onto something else), or when the model's face score collapses (`collapsed`: the same frame is
retried from the tracker's points and the caller asks for a detection). A face found from neither framing
is covered by the face-lost policy (`unfound_as_lost`).

A chain that starts (or restarts) settles on its first frame: the model, framed by the tracker's points, places
the face about 2 px off where its own framing puts it, and a chain left to find that over the next frames slides
the swapped face there; two more passes framed by the chain's own points find it at once (`settle_passes`).
"""

from dataclasses import dataclass, replace
from typing import Protocol, runtime_checkable

import cv2
import numpy as np

from app.pipeline.align import AlignSpec, estimate_matrix, transform_points, warp_crop
from app.pipeline.landmarks import INPUT_SIZE, FaceMeshLandmarker, Mesh, five_points
from app.pipeline.types import Face, Image

ROI = AlignSpec("face_mesh", INPUT_SIZE)


@dataclass(frozen=True)
class MeshTrackConfig:
    # Centre-to-centre distance between the chain's five points and the tracker's, in eye distances, beyond
    # which the tracker is believed: far above the 0.03-0.09 the two differ by on the same face.
    max_disagreement: float = 0.5
    # Extra passes on a chain's first frame, each framed by the previous pass's own points: the model frames a
    # face a little differently from the detector, and a chain started from the detector's points would
    # otherwise settle onto its own framing over the next few frames, the swapped face sliding as it does.
    settle_passes: int = 2


def eye_distance(points: np.ndarray) -> float:
    return max(float(np.linalg.norm(points[1] - points[0])), 1.0)


def mesh_in(mesh: Mesh, matrix: np.ndarray) -> Mesh:
    """A mesh mapped by a similarity `matrix` (depth scaled like x and y)."""
    xy = transform_points(mesh[:, :2], matrix)
    z = mesh[:, 2:] * float(np.sqrt(abs(np.linalg.det(matrix[:, :2]))))
    return np.hstack([xy, z]).astype(np.float32)


class MeshTracking:
    """One stream's dense landmarks, by track id, in frame pixels."""

    def __init__(self, landmarker: FaceMeshLandmarker, config: MeshTrackConfig | None = None) -> None:
        self.landmarker = landmarker
        self.config = config or MeshTrackConfig()
        self._meshes: dict[int, Mesh] = {}
        self.collapsed = False  # the latest call lost a face the tracker still has: detect again

    def seed(self, face: Face) -> np.ndarray:
        """The five points that frame `face`'s crop: its previous mesh's, unless the tracker disagrees."""
        previous = self._meshes.get(face.track_id)
        if previous is None:
            return face.landmarks
        chained = five_points(previous)
        apart = float(np.linalg.norm(chained.mean(axis=0) - face.landmarks.mean(axis=0)))
        if apart > self.config.max_disagreement * eye_distance(face.landmarks):
            return face.landmarks
        return chained

    def follow(self, frames: list[Image], faces: list[list[Face]]) -> tuple[list[list[Face]], list[list[Mesh | None]]]:
        """Each face's mesh in its frame (None where the model lost it) and the face with its five points
        taken from that mesh. Frames are taken in order: a face's chain runs through the batch."""
        out_faces: list[list[Face]] = []
        out_meshes: list[list[Mesh | None]] = []
        self.collapsed = False
        for frame, frame_faces in zip(frames, faces, strict=True):
            seeds = [self.seed(face) for face in frame_faces]
            found = self._landmarks(frame, seeds)
            # A chain that lost its face is retried from the tracker's points (the face may be where the
            # tracker says and the chain drifted): only a face found from neither is left without a mesh.
            retry = [i for i, face in enumerate(frame_faces) if found[i] is None and seeds[i] is not face.landmarks]
            for i, again in zip(retry, self._landmarks(frame, [frame_faces[i].landmarks for i in retry]), strict=True):
                found[i] = again
            # Chains framed by the tracker's points on this frame (new, restarted or retried) settle first.
            fresh = [i for i, face in enumerate(frame_faces) if seeds[i] is face.landmarks or i in retry]
            self._settle(frame, found, fresh)
            moved: list[Face] = []
            meshes: list[Mesh | None] = []
            for face, mesh in zip(frame_faces, found, strict=True):
                if mesh is None:
                    self._meshes.pop(face.track_id, None)
                    self.collapsed = True
                    moved.append(face)
                    meshes.append(None)
                    continue
                self._meshes[face.track_id] = mesh
                moved.append(replace(face, landmarks=five_points(mesh)))
                meshes.append(mesh)
            out_faces.append(moved)
            out_meshes.append(meshes)
        return out_faces, out_meshes

    def _settle(self, frame: Image, found: list[Mesh | None], fresh: list[int]) -> None:
        """Re-find the meshes of chains that start on this frame (`fresh` indexes `found`) from their own points,
        `settle_passes` times; a pass that loses the face keeps the one before."""
        for _ in range(self.config.settle_passes):
            ready = [i for i in fresh if found[i] is not None]
            if not ready:
                return
            seeds = [five_points(found[i]) for i in ready]  # type: ignore[arg-type]
            for i, again in zip(ready, self._landmarks(frame, seeds), strict=True):
                if again is not None:
                    found[i] = again

    def _landmarks(self, frame: Image, seeds: list[np.ndarray]) -> list[Mesh | None]:
        """Meshes in frame pixels, each found on a crop framed by its five `seeds` points."""
        if not seeds:
            return []
        matrices = [estimate_matrix(seed, ROI) for seed in seeds]
        found = self.landmarker.process([warp_crop(frame, matrix, INPUT_SIZE) for matrix in matrices])
        return [
            None if mesh is None else mesh_in(mesh, cv2.invertAffineTransform(matrix))
            for matrix, mesh in zip(matrices, found, strict=True)
        ]

    def forget_except(self, track_ids: set[int]) -> None:
        """Drop the chains of faces whose tracks ended."""
        for track_id in [t for t in self._meshes if t not in track_ids]:
            del self._meshes[track_id]


@runtime_checkable
class TracksLandmarks(Protocol):
    """A swap engine that takes dense landmarks tracked by the caller (`SwapItem.mesh`)."""

    def new_landmark_tracking(self) -> MeshTracking: ...


def unfound_as_lost(
    located: list[list[Face]], chosen: list[list[Face]], meshes: list[list[Mesh | None]]
) -> tuple[list[list[Face]], list[list[Face]], list[list[Mesh | None]]]:
    """Faces the landmark model finds from no framing (under a hand, half out of the frame) taken out of the
    swap and marked lost, so the face-lost policy covers them: a swap engine that needs landmarks would
    otherwise return such a crop as it is, showing the real face."""
    unfound = [
        {face.track_id for face, mesh in zip(frame_faces, frame_meshes, strict=True) if mesh is None}
        for frame_faces, frame_meshes in zip(chosen, meshes, strict=True)
    ]
    if not any(unfound):
        return located, chosen, meshes
    kept_faces, kept_meshes = [], []
    for frame_faces, frame_meshes, gone in zip(chosen, meshes, unfound, strict=True):
        pairs = [(f, m) for f, m in zip(frame_faces, frame_meshes, strict=True) if f.track_id not in gone]
        kept_faces.append([face for face, _ in pairs])
        kept_meshes.append([mesh for _, mesh in pairs])
    marked = [
        [replace(face, status="lost") if face.track_id in gone else face for face in frame_faces]
        for frame_faces, gone in zip(located, unfound, strict=True)
    ]
    return marked, kept_faces, kept_meshes
