"""Which face of a source photo becomes the identity: the one rule for uploads, stored identities and files.

`face_index` picks a face by position (faces ordered by detector score); `"only"` accepts a photo with exactly
one face and refuses a group photo rather than guessing (uploads and stored identities); `"largest"` takes the
biggest face (the file CLI and benchmarks, where the source photo is the user's own choice).
"""

from typing import Literal

from app.errors import UserError
from app.pipeline.types import Face

FaceChoice = int | Literal["only", "largest"]


class FaceChoiceError(UserError):
    """The photo has no face, or not the one asked for."""


def choose_face(faces: list[Face], choice: FaceChoice) -> Face:
    if not faces:
        raise FaceChoiceError("no face found in the image")
    if choice == "largest":
        return max(faces, key=lambda f: f.area)
    if choice == "only":
        if len(faces) > 1:
            raise FaceChoiceError(
                f"found {len(faces)} faces; choose one with face_index 0..{len(faces) - 1} (by detector score)"
            )
        return faces[0]
    if 0 <= choice < len(faces):
        return faces[choice]
    raise FaceChoiceError(f"the image has {len(faces)} face(s); face_index {choice} does not exist")


def enrolled_choice(face_index: int | None) -> FaceChoice:
    """The choice an identity was enrolled with: its face_index, else its only face."""
    return "only" if face_index is None else face_index
