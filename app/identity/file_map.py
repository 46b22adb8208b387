"""Identity maps for file jobs (`swapcast swap --map PERSON.jpg=FACE.jpg`): each person, known by a photo of
theirs, becomes the face of another photo; faces of anyone else are left as they are."""

from collections.abc import Sequence
from pathlib import Path

from app.errors import UserError
from app.identity.embedder import build_embedder
from app.pipeline.face_choice import FaceChoiceError, choose_face
from app.pipeline.identity_map import IdentityMap, MapEntry, MappedFaces
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from engines.store import ModelStore

MapPaths = tuple[Path, Path]  # (photo of the person to look for, photo of the face they get)


def parse_map_entry(text: str) -> MapPaths:
    """`PERSON.jpg=FACE.jpg` as two paths; ValueError with the reason otherwise (argparse reports it)."""
    person, sep, face = text.partition("=")
    if not sep or not person or not face:
        raise ValueError(f"expected PERSON_PHOTO=FACE_PHOTO, got {text!r}")
    return Path(person), Path(face)


def check_map_paths(entries: Sequence[MapPaths]) -> None:
    for person, face in entries:
        for path in (person, face):
            if not path.is_file():
                raise UserError(f"map photo not found: {path}")


def mapped_faces(
    pipeline: FramePipeline,
    entries: Sequence[MapPaths],
    settings: PipelineSettings,
    store: ModelStore,
) -> MappedFaces:
    """The map for a file job: each person's reference from the largest face of their photo, each face prepared
    from the largest face of its photo; the match threshold from `settings` (else the embedder's own)."""
    from app.media.video_file import read_image

    embedder = build_embedder(pipeline.engine, settings, store)
    built = []
    for person_path, face_path in entries:
        person = read_image(person_path)
        (found,) = pipeline.detector.process([person])
        try:
            face = choose_face(found, "largest")
        except FaceChoiceError as exc:
            raise UserError(f"map photo {person_path}: {exc}") from None
        try:
            source = pipeline.prepare_source(read_image(face_path), "largest")
        except UserError as exc:
            raise UserError(f"map photo {face_path}: {exc}") from None
        (reference,) = embedder.embed(person, [face])
        built.append(MapEntry(str(person_path), str(face_path), reference, source))
    threshold = settings.match_threshold if settings.match_threshold is not None else embedder.same_person
    return MappedFaces(IdentityMap(tuple(built), threshold, embedder.key), embedder)
