"""`swapcast swap`: swap a face into an image or a video file (the job itself is `app.swap_job`)."""

import argparse
from pathlib import Path

from pydantic import ValidationError

from app.commands.arguments import int_between, non_negative_int, positive_int, unit_fraction
from app.commands.options import add_engine_argument
from app.errors import UserError
from app.names import OCCLUSION_MODES
from app.settings import PipelineSettings


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("swap", help="swap the source face into an image or a video")
    p.add_argument("--source", type=Path, default=None, help="photo of the face to put in (or --map)")
    p.add_argument(
        "--map",
        dest="identity_map",
        action="append",
        type=_map_entry,
        default=[],
        metavar="PERSON=FACE",
        help="swap only this person (known by a photo of theirs) with the face of another photo; repeatable; "
        "faces of anyone else are left as they are",
    )
    p.add_argument(
        "--match-threshold",
        type=float,
        default=None,
        help="cosine similarity a face needs to a --map person (default: the embedder's own)",
    )
    p.add_argument("--target", required=True, type=Path, help="image or video to change")
    p.add_argument("--output", required=True, type=Path, help="where to write the result")
    add_engine_argument(p)
    p.add_argument("--swapper-model", default=None, help="registry name of the inswapper-contract model")
    p.add_argument("--recognizer-model", default=None, help="registry name of the ArcFace-contract model")
    p.add_argument("--enhancer", default=None, help="registry name of a Real-ESRGAN model, or 'none'")
    p.add_argument("--enhance-blend", type=unit_fraction, default=None, help="0..1, share of the super-resolved face")
    p.add_argument(
        "--mouth-mask", type=unit_fraction, default=None, help="0..1, keep the target's own mouth (default 0)"
    )
    p.add_argument(
        "--occlusion",
        choices=OCCLUSION_MODES,
        default=None,
        help="keep hands in front of faces: hands, off, or auto (hands when the hand model is imported; default)",
    )
    p.add_argument("--faces", choices=("all", "largest"), default=None, help="which target faces to swap")
    p.add_argument(
        "--source-face",
        type=non_negative_int,
        default=None,
        help="index of the face in the source photo (default: largest)",
    )
    p.add_argument(
        "--detect-interval", type=int_between(1, 60), default=None, help="detect every K frames, track between"
    )
    p.add_argument("--batch-size", type=positive_int, default=4, help="frames per pipeline call (video)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--owner",
        default=None,
        help="who the output belongs to in the mark registry (default SWAPCAST_OWNER, else the OS user name)",
    )
    p.set_defaults(func=run)


def _map_entry(text: str) -> tuple[Path, Path]:
    from app.identity.file_map import parse_map_entry

    try:
        return parse_map_entry(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _settings(args: argparse.Namespace) -> PipelineSettings:
    overrides = {
        "engine": args.engine,
        "swapper_model": args.swapper_model,
        "recognizer_model": args.recognizer_model,
        "enhance_blend": args.enhance_blend,
        "mouth_mask": args.mouth_mask,
        "occlusion": args.occlusion,
        "faces": args.faces,
        "detect_interval": args.detect_interval,
        "match_threshold": args.match_threshold,
    }
    values: dict[str, object] = {k: v for k, v in overrides.items() if v is not None}
    if args.enhancer is not None:
        values["enhancer_model"] = None if args.enhancer.lower() == "none" else args.enhancer
    try:
        settings = PipelineSettings.model_validate(values)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise UserError(f"invalid option {first['loc'][0]}: {first['msg']}") from None
    # Like `swapcast serve`, an engine named nowhere is `auto` (the pipeline's own default stays classic).
    if "engine" not in settings.model_fields_set:
        settings = settings.model_copy(update={"engine": "auto"})
    return settings


def run(args: argparse.Namespace) -> int:
    from app.model_store import open_model_store
    from app.provenance.owner import check_owner
    from app.swap_job import check_paths, swap_file

    if (args.source is None) == (not args.identity_map):
        raise UserError("give either --source or --map")
    check_paths(args.source, args.target, args.output)
    if args.owner is not None:
        check_owner(args.owner)  # a bad name fails before any model loads
    message = swap_file(
        args.source,
        args.target,
        args.output,
        _settings(args),
        open_model_store(),
        source_face=args.source_face,
        batch_size=args.batch_size,
        progress=not args.no_progress,
        owner=args.owner,
        identity_map=args.identity_map,
    )
    print(message)
    return 0
