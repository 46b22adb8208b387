"""`swapcast bench-quality`: identity transfer and expression kept, per engine, on pairs of sample photos."""

import argparse
import json
import sys
from pathlib import Path

from app.commands.arguments import comma_list
from app.errors import UserError

KNOWN = ("passthrough", "classic", "mesh", "inswapper")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("bench-quality", help="swap quality per engine: identity, landmark and eye/mouth errors")
    p.add_argument(
        "--engines",
        type=comma_list,
        default=None,
        help="comma list (default: passthrough,classic,mesh, and inswapper when its weights are present)",
    )
    p.add_argument("--pairs", type=int, default=None, help="use only this many (source, target) pairs")
    p.add_argument("--out", type=Path, default=Path("bench-quality"), help="folder for quality.json and grid.png")
    p.add_argument("--grid-rows", type=int, default=12, help="pairs shown in the PNG grid")
    p.add_argument("--threads", type=int, default=None, help="inference threads (default: all cores)")
    p.set_defaults(func=run)


def _engines(requested: tuple[str, ...] | None) -> tuple[str, ...]:
    from app.model_store import open_model_store
    from app.settings import PipelineSettings

    if requested is None:
        settings, store = PipelineSettings(), open_model_store()
        present = all(store.status(n) == "verified" for n in (settings.swapper_model, settings.recognizer_model))
        return ("passthrough", "classic", "mesh", *(("inswapper",) if present else ()))
    unknown = [name for name in requested if name not in KNOWN]
    if unknown or not requested:
        raise UserError(f"unknown engine {unknown[0] if unknown else ''!r}; choose from {', '.join(KNOWN)}")
    return requested


def run(args: argparse.Namespace) -> int:
    if args.pairs is not None and args.pairs < 1:
        raise UserError("--pairs must be at least 1")
    if args.grid_rows < 0:
        raise UserError("--grid-rows must not be negative")
    if args.threads is not None and args.threads < 1:
        raise UserError("--threads must be at least 1")
    names = _engines(args.engines)

    from app.bench.face_measure import DlibMeasurer
    from app.bench.quality_bench import QualityBench, make_pairs, portraits
    from app.model_store import open_model_store
    from app.pipeline.factory import build_pipeline
    from app.settings import PipelineSettings

    measurer = DlibMeasurer()  # fails early, with the install hint, where dlib is missing
    store = open_model_store()
    extra = {"threads": args.threads} if args.threads else {}
    pipelines = {name: build_pipeline(PipelineSettings(engine=name, faces="largest", **extra), store) for name in names}
    people = portraits(next(iter(pipelines.values())).detector)
    if len(people) < 2:
        raise UserError(f"bench-quality needs face photos of two people at least; found {len(people)}")
    pairs = make_pairs(people, args.pairs)
    args.out.mkdir(parents=True, exist_ok=True)
    grid = args.out / "grid.png"
    report = QualityBench(pipelines, measurer).run(
        pairs, grid_path=grid if args.grid_rows else None, grid_rows=args.grid_rows
    )
    text = json.dumps(report.as_dict(), indent=2)
    from engines.atomic import write_bytes_atomic

    write_bytes_atomic(args.out / "quality.json", (text + "\n").encode("utf-8"))
    _print_table(report.as_dict())
    print(f"wrote {args.out / 'quality.json'}" + (f" and {grid}" if args.grid_rows else ""), file=sys.stderr)
    return 0


def _print_table(report: dict[str, object]) -> None:
    columns = (
        ("engine", "engine"),
        ("pairs", "pairs"),
        ("to source", "distance_to_source"),
        ("to target", "distance_to_target"),
        ("closer to source", "closer_to_source"),
        ("landmark error", "landmark_error"),
        ("eye error", "eye_opening_error"),
        ("mouth error", "mouth_opening_error"),
        ("ms/image", "ms_per_image"),
    )
    rows = [[str(row[key]) for _, key in columns] for row in report["engines"]]  # type: ignore[attr-defined]
    widths = [max(len(title), *(len(r[i]) for r in rows)) for i, (title, _) in enumerate(columns)]
    print("  ".join(title.ljust(w) for (title, _), w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
