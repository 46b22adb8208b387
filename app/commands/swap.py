"""`swapcast swap`: swap a face into an image or a video file."""

import argparse
import os
from pathlib import Path

from pydantic import ValidationError

from app.errors import UserError
from app.pipeline.types import Image
from app.settings import PipelineSettings

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".bmp"}
VIDEO_SUFFIXES = {".mp4", ".mkv", ".mov", ".avi", ".webm", ".m4v"}
ENGINES = ("classic", "inswapper", "passthrough")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("swap", help="swap the source face into an image or a video")
    p.add_argument("--source", required=True, type=Path, help="photo of the face to put in")
    p.add_argument("--target", required=True, type=Path, help="image or video to change")
    p.add_argument("--output", required=True, type=Path, help="where to write the result")
    p.add_argument("--engine", default="classic", help=f"swap engine: {', '.join(ENGINES)} (default classic)")
    p.add_argument("--swapper-model", default=None, help="registry name of the inswapper-contract model")
    p.add_argument("--recognizer-model", default=None, help="registry name of the ArcFace-contract model")
    p.add_argument("--enhancer", default=None, help="registry name of a Real-ESRGAN model, or 'none'")
    p.add_argument("--enhance-blend", type=float, default=None, help="0..1, share of the super-resolved face")
    p.add_argument("--faces", choices=("all", "largest"), default=None, help="which target faces to swap")
    p.add_argument("--source-face", type=int, default=None, help="index of the face in the source photo")
    p.add_argument("--detect-interval", type=int, default=None, help="detect every K frames, track between")
    p.add_argument("--batch-size", type=int, default=4, help="frames per pipeline call (video)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def _settings(args: argparse.Namespace) -> PipelineSettings:
    if args.engine not in ENGINES:
        raise UserError(f"unknown engine {args.engine!r}; choose one of: {', '.join(ENGINES)}")
    overrides = {
        "engine": args.engine,
        "swapper_model": args.swapper_model,
        "recognizer_model": args.recognizer_model,
        "enhance_blend": args.enhance_blend,
        "faces": args.faces,
        "detect_interval": args.detect_interval,
    }
    values: dict[str, object] = {k: v for k, v in overrides.items() if v is not None}
    if args.enhancer is not None:
        values["enhancer_model"] = None if args.enhancer.lower() == "none" else args.enhancer
    try:
        return PipelineSettings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"invalid option {first['loc'][0]}: {first['msg']}") from None


def _check_paths(source: Path, target: Path, output: Path) -> str:
    if not source.is_file():
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


def run(args: argparse.Namespace) -> int:
    _check_paths(args.source, args.target, args.output)
    settings = _settings(args)
    if args.batch_size < 1:
        raise UserError("--batch-size must be at least 1")
    message = swap_file(
        args.source,
        args.target,
        args.output,
        settings,
        source_face=args.source_face,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )
    print(message)
    return 0


def swap_file(
    source_path: Path,
    target: Path,
    output: Path,
    settings: PipelineSettings,
    *,
    source_face: int | None = None,
    batch_size: int = 4,
    progress: bool = True,
) -> str:
    """Swap the face of `source_path` into an image or video `target`, writing `output` atomically."""
    kind = _check_paths(source_path, target, output)
    from app.media.video_file import probe, read_image, transcode, write_image
    from app.pipeline.factory import build_pipeline

    source_image = read_image(source_path)
    if kind == "video":
        probe(target)  # a corrupt or non-video target fails here, before models load
    else:
        target_image = read_image(target)
    from app.provenance.c2pa_files import mime_of, sign_file, signing_configured
    from app.provenance.service import Provenance

    provenance = Provenance()
    signed = signing_configured(provenance.settings)
    if signed:
        mime_of(output)  # an output format C2PA cannot carry fails before any work
    pipeline = build_pipeline(settings)
    source = pipeline.prepare_source(source_image, source_face)
    marker = provenance.marker(kind="file", ref=str(output.resolve()), identity=f"photo:{source_path.name}")

    if kind == "image":
        result = pipeline.swap_image(target_image, source)
        write_image(output, marker.apply(result.image))
        message = f"swapped {len(result.faces)} face(s) -> {output}"
    else:
        tracker = pipeline.new_stream()

        def process(frames: list[Image]) -> list[Image]:
            return [marker.apply(r.image) for r in pipeline.process(frames, source, tracker)]

        stats = transcode(target, output, process, batch_size=batch_size, progress=progress)
        audio = "audio copied" if stats.audio_copied else ("audio re-encoded" if stats.audio_reencoded else "no audio")
        message = f"{stats.frames} frames at {stats.fps:.1f} fps, {audio} -> {output}"
    if signed:
        mark = marker.record.mark if marker.record else None
        sign_file(output, target=target, engine=settings.engine, settings=provenance.settings, watermark=mark)
        message += " (C2PA signed)"
    return message
