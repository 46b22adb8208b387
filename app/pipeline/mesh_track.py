"""Dense landmarks followed from frame to frame, as MediaPipe's face mesh is meant to run.

Each tracked face's 468 points are found on a crop framed by that face's own points in the previous frame
(their five points aligned on the model's ROI template, one model pass), not by the box tracker's prediction:
the tracker's Kalman points and the mesh's five points differ by 0.03-0.09 eye distances on the same face, so
switching between them would make the swapped face jump at every detection. The tracker still decides which
faces exist (detections, entries, exits, the face-lost policy); the mesh only says where each one is.

A face's chain restarts from the tracker's points when there is none yet, when the two disagree by more than
`max_disagreement` eye distances (the detector found the face somewhere else: it jumped, or the chain
drifted onto something else), or when the model's face score collapses (`collapsed`: the caller then asks
for a detection and swaps that frame from the tracker's points as before).
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
            matrices = [estimate_matrix(self.seed(face), ROI) for face in frame_faces]
            rois = [warp_crop(frame, matrix, INPUT_SIZE) for matrix in matrices]
            found = self.landmarker.process(rois)
            moved: list[Face] = []
            meshes: list[Mesh | None] = []
            for face, matrix, mesh in zip(frame_faces, matrices, found, strict=True):
                if mesh is None:
                    self._meshes.pop(face.track_id, None)
                    self.collapsed = True
                    moved.append(face)
                    meshes.append(None)
                    continue
                in_frame = mesh_in(mesh, cv2.invertAffineTransform(matrix))
                self._meshes[face.track_id] = in_frame
                moved.append(replace(face, landmarks=five_points(in_frame)))
                meshes.append(in_frame)
            out_faces.append(moved)
            out_meshes.append(meshes)
        return out_faces, out_meshes

    def forget_except(self, track_ids: set[int]) -> None:
        """Drop the chains of faces whose tracks ended."""
        for track_id in [t for t in self._meshes if t not in track_ids]:
            del self._meshes[track_id]


@runtime_checkable
class TracksLandmarks(Protocol):
    """A swap engine that takes dense landmarks tracked by the caller (`SwapItem.mesh`)."""

    def new_landmark_tracking(self) -> MeshTracking: ...
