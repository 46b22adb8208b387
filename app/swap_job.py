"""A file job: swap the face of a source photo into an image or a video, writing the output atomically. Used by
`swapcast swap` and `swapcast demo`."""

import os
from collections.abc import Sequence
from pathlib import Path

from app.errors import UserError
from app.identity.file_map import MapPaths, check_map_paths, mapped_faces
from app.pipeline.identity_map import FaceSources
from app.pipeline.types import Image
from app.settings import PipelineSettings
from engines.store import ModelStore

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
VIDEO_SUFFIXES = {".mp4", ".mkv", ".mov", ".avi", ".webm", ".m4v"}


def check_paths(source: Path | None, target: Path, output: Path) -> str:
    """`image` or `video`: what the target is, once every path is known to be usable."""
    if source is not None and not source.is_file():
        raise UserError(f"source image not found: {source}")
    if not target.is_file():
        raise UserError(f"target not found: {target}")
    kind = "image" if target.suffix.lower() in IMAGE_SUFFIXES else "video"
    wanted = IMAGE_SUFFIXES if kind == "image" else VIDEO_SUFFIXES
    if output.suffix.lower() not in wanted:
        raise UserError(f"output {output} must end in one of {', '.join(sorted(wanted))} for a {kind} target")
    directory = output.parent if str(output.parent) else Path(".")
    if not directory.is_dir():
        raise UserError(f"output directory does not exist: {directory}")
    if not os.access(directory, os.W_OK):
        raise UserError(f"output directory is not writable: {directory}")
    if output.resolve() == target.resolve():
        raise UserError("output must not overwrite the target")
    return kind


def swap_file(
    source_path: Path | None,
    target: Path,
    output: Path,
    settings: PipelineSettings,
    store: ModelStore,
    *,
    source_face: int | None = None,
    batch_size: int = 4,
    progress: bool = True,
    owner: str | None = None,
    identity_map: Sequence[MapPaths] = (),
) -> str:
    """Swap the face of `source_path` (its largest face, or the one at `source_face`) into an image or video
    `target`, or with `identity_map` each mapped person's face only, writing `output` atomically; returns a
    one-line summary. `owner` (else the `SWAPCAST_OWNER` setting, else the OS user) is who the output's mark is
    issued to in the mark registry."""
    if (source_path is None) == (not identity_map):
        raise UserError("give either a source photo or an identity map")
    kind = check_paths(source_path, target, output)
    check_map_paths(identity_map)
    from app.content.files import file_screen
    from app.content.settings import ContentSettings
    from app.media.video_file import probe, read_image, transcode, write_image
    from app.pipeline.factory import build_pipeline

    source_image = read_image(source_path) if source_path is not None else None
    fps = 0.0
    if kind == "video":
        fps = float(probe(target).fps)  # a corrupt or non-video target fails here, before models load
    else:
        target_image = read_image(target)
    from app.provenance.owner import cli_owner
    from app.provenance.service import Provenance
    from app.provenance_files.c2pa_files import mime_of, sign_file, signing_configured

    provenance = Provenance()
    owner = cli_owner(owner, provenance.settings.owner)
    signed = signing_configured(provenance.settings)
    if signed:
        mime_of(output)  # an output format C2PA cannot carry fails before any work
    screen = file_screen(ContentSettings(), store, fps)  # None unless SWAPCAST_CONTENT_POLICY asks for it
    if screen is not None and source_image is not None:
        screen.photo(source_image, "source photo")
    pipeline = build_pipeline(settings, store)
    source: FaceSources
    if source_image is not None and source_path is not None:
        source = pipeline.prepare_source(source_image, "largest" if source_face is None else source_face)
        identity = f"photo:{source_path.name}"
    else:
        source = mapped_faces(pipeline, identity_map, settings, store)
        identity = "map:" + ",".join(face.name for _, face in identity_map)
    marker = provenance.marker(kind="file", ref=str(output.resolve()), identity=identity, owner=owner)

    if kind == "image":
        result = pipeline.swap_image(target_image, source)
        if screen is not None:
            screen.frames([target_image], [result.image])
        write_image(output, marker.apply(result.image))
        message = f"swapped {len(result.faces)} face(s) -> {output}"
    else:
        tracker = pipeline.new_stream()

        def process(frames: list[Image]) -> list[Image]:
            swapped = [r.image for r in pipeline.process(frames, source, tracker)]
            if screen is not None:
                screen.frames(frames, swapped)
            return [marker.apply(image) for image in swapped]

        stats = transcode(target, output, process, batch_size=batch_size, progress=progress)
        audio = "audio copied" if stats.audio_copied else ("audio re-encoded" if stats.audio_reencoded else "no audio")
        message = f"{stats.frames} frames at {stats.fps:.1f} fps, {audio} -> {output}"
    if signed:
        mark = marker.record.mark if marker.record else None
        sign_file(output, target=target, engine=pipeline.engine.name, settings=provenance.settings, watermark=mark)
        message += " (C2PA signed)"
    return message
