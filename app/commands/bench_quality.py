"""`swapcast bench quality`: swap quality per engine, each figure judged against its target.

Sections: likeness (identity moved, expression kept, on pairs of sample photos), occlusion (a real hand crossing
a face: hand kept, face still swapped, cost) and flicker (a still head's flicker, jitter, lag on fast motion);
the targets are in app.bench.targets."""

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.commands.arguments import add_hand_clip_options, comma_list
from app.commands.bench_args import chosen
from app.commands.from_args import picked
from app.commands.options import add_engine_list_argument
from app.errors import UserError

if TYPE_CHECKING:
    from engines.store import ModelStore

KNOWN = ("passthrough", "classic", "mesh", "inswapper")
SECTIONS = ("likeness", "occlusion", "flicker")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("quality", help="swap quality per engine: identity, landmark and eye/mouth errors")
    add_engine_list_argument(
        p, "comma list (default: passthrough,classic,mesh, and inswapper when its weights are present)"
    )
    p.add_argument("--pairs", type=int, default=None, help="use only this many (source, target) pairs")
    p.add_argument("--out", type=Path, default=Path("bench-quality"), help="folder for quality.json and grid.png")
    p.add_argument("--grid-rows", type=int, default=12, help="pairs shown in the PNG grid")
    p.add_argument("--threads", type=int, default=None, help="inference threads (default: all cores)")
    p.add_argument(
        "--sections",
        type=comma_list,
        default=None,
        help=f"comma list of {', '.join(SECTIONS)} (default all; occlusion and flicker skip passthrough)",
    )
    add_hand_clip_options(p)
    p.set_defaults(func=run)


def _engines(requested: tuple[str, ...] | None) -> tuple[str, ...]:
    from app.model_store import open_model_store
    from app.settings import PipelineSettings

    if requested is None:
        settings, store = PipelineSettings(), open_model_store()
        present = all(store.status(n) == "verified" for n in (settings.swapper_model, settings.recognizer_model))
        return ("passthrough", "classic", "mesh", *(("inswapper",) if present else ()))
    return chosen(requested, KNOWN, "engine")


def run(args: argparse.Namespace) -> int:
    if args.pairs is not None and args.pairs < 1:
        raise UserError("--pairs must be at least 1")
    if args.grid_rows < 0:
        raise UserError("--grid-rows must not be negative")
    if args.threads is not None and args.threads < 1:
        raise UserError("--threads must be at least 1")
    sections = SECTIONS if args.sections is None else chosen(args.sections, SECTIONS, "section")
    names = _engines(args.engines)

    from app.bench import targets
    from app.model_store import open_model_store
    from engines.atomic import write_bytes_atomic

    store = open_model_store()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"sections": list(sections)}
    rows: list[dict[str, Any]] = []
    grid = args.out / "grid.png" if "likeness" in sections and args.grid_rows else None
    if "likeness" in sections:
        report.update(_likeness(names, store, args.pairs, grid, args.grid_rows, args.threads))
        for score in report["engines"]:
            rows += targets.rows("likeness", score["engine"], score)
    moving = [name for name in names if name != "passthrough"]  # passthrough paints nothing to judge
    if {"occlusion", "flicker"} & set(sections):
        from app.bench.stability import flicker_figures, measure, occlusion_figures

        report |= measure(
            moving,
            store,
            **picked(args, "frames", "hand_model", "threads"),
            occlusion="occlusion" in sections,
            flicker="flicker" in sections,
        )
        for name in moving:
            if name in report["occlusion"]:
                rows += targets.rows("occlusion", name, occlusion_figures(report["occlusion"][name]))
            flicker = [row for row in report["flicker"] if row["engine"] == name]
            if flicker:
                rows += targets.rows("flicker", name, flicker_figures(flicker))
    report["rows"] = rows
    text = json.dumps(report, indent=2)
    write_bytes_atomic(args.out / "quality.json", (text + "\n").encode("utf-8"))
    if "likeness" in sections:
        _print_table(report)
        print()
    print_rows(rows)
    print(f"wrote {args.out / 'quality.json'}" + (f" and {grid}" if grid else ""), file=sys.stderr)
    return 0


def _likeness(
    names: tuple[str, ...],
    store: "ModelStore",
    pairs: int | None,
    grid: Path | None,
    grid_rows: int,
    threads: int | None,
) -> dict[str, Any]:
    from app.bench.face_measure import DlibMeasurer
    from app.bench.quality_bench import QualityBench, make_pairs, portraits
    from app.pipeline.factory import build_pipeline
    from app.settings import PipelineSettings

    measurer = DlibMeasurer()  # fails early, with the install hint, where dlib is missing
    extra: dict[str, Any] = {"threads": threads} if threads else {}
    pipelines = {name: build_pipeline(PipelineSettings(engine=name, faces="largest", **extra), store) for name in names}
    people = portraits(next(iter(pipelines.values())).detector)
    if len(people) < 2:
        raise UserError(f"bench quality needs face photos of two people at least; found {len(people)}")
    report = QualityBench(pipelines, measurer).run(make_pairs(people, pairs), grid_path=grid, grid_rows=grid_rows)
    return report.as_dict()


def print_rows(rows: list[dict[str, Any]]) -> None:
    """The judged rows as a table: section, engine, row, value, target, met."""
    table = [["section", "engine", "row", "value", "target", "met"]]
    for row in rows:
        met = "-" if row["met"] is None else ("met" if row["met"] else "NOT MET")
        table.append([row["section"], row["engine"], row["row"], f"{row['value']:g}", row["target"] or "-", met])
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


def _print_table(report: dict[str, Any]) -> None:
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
    rows = [[str(row[key]) for _, key in columns] for row in report["engines"]]
    widths = [max(len(title), *(len(r[i]) for r in rows)) for i, (title, _) in enumerate(columns)]
    print("  ".join(title.ljust(w) for (title, _), w in zip(columns, widths, strict=True)))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
