"""`swapcast bench stability`: hands kept in front of the face (occlusion) and the swapped face's steadiness
(flicker, landmark jitter, lag), per engine, on clips made from packaged photos, with every figure the benches
give. `swapcast bench quality` judges the same measurements against their targets (app.bench.stability)."""

import argparse
import json
import sys
from pathlib import Path

from app.commands.arguments import add_hand_clip_options, int_between
from app.commands.bench_args import chosen
from app.commands.from_args import picked
from app.commands.options import add_engine_list_argument

KNOWN = ("classic", "mesh")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "stability",
        help="occlusion (a real hand crossing a face: hand kept, IoU, cost) and flicker/jitter/lag per engine",
    )
    add_engine_list_argument(p, "comma list of classic, mesh (default both)")
    add_hand_clip_options(p)
    p.add_argument("--no-flicker", action="store_true", help="measure occlusion only")
    p.add_argument("--out", type=Path, default=Path("bench-stability.json"), help="where to write the JSON report")
    p.add_argument("--threads", type=int_between(1, 64), default=None, help="inference threads (default: all cores)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    engines = chosen(args.engines, KNOWN, "engine") if args.engines else KNOWN

    from app.bench.stability import measure
    from app.model_store import open_model_store
    from engines.atomic import write_bytes_atomic

    store = open_model_store()
    report = measure(
        engines,
        store,
        **picked(args, "frames", "hand_model", "threads"),
        flicker=not args.no_flicker,
        raw_landmarks=True,
    )
    text = json.dumps(report, indent=2)
    write_bytes_atomic(args.out, (text + "\n").encode("utf-8"))
    print(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
