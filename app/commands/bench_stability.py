"""`swapcast bench-stability`: hands kept in front of the face (occlusion) and the swapped face's steadiness
(flicker, landmark jitter, lag), per engine, on clips made from packaged photos, with every figure the benches
give. `swapcast bench-quality` judges the same measurements against their targets (app.bench.stability)."""

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from app.commands.arguments import add_hand_clip_options, comma_list, int_between
from app.errors import UserError

KNOWN = ("classic", "mesh")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "bench-stability",
        help="occlusion (a real hand crossing a face: hand kept, IoU, cost) and flicker/jitter/lag per engine",
    )
    p.add_argument("--engines", type=comma_list, default=None, help="comma list of classic, mesh (default both)")
    add_hand_clip_options(p)
    p.add_argument("--no-flicker", action="store_true", help="measure occlusion only")
    p.add_argument("--out", type=Path, default=Path("bench-stability.json"), help="where to write the JSON report")
    p.add_argument("--threads", type=int_between(1, 64), default=None, help="inference threads (default: all cores)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    engines = tuple(args.engines) if args.engines else KNOWN
    unknown = [name for name in engines if name not in KNOWN]
    if unknown:
        raise UserError(f"unknown engine {unknown[0]!r}; choose from {', '.join(KNOWN)}")

    from app.bench.stability import measure
    from app.model_store import open_model_store
    from engines.atomic import write_bytes_atomic

    store = open_model_store()
    report: dict[str, Any] = {"occlusion": {}, "flicker": []}
    for name in engines:
        got = measure(
            name,
            store,
            frames=args.frames,
            hand_model=args.hand_model,
            flicker=not args.no_flicker,
            raw_landmarks=True,
            threads=args.threads,
        )
        report["occlusion"][name] = got["occlusion"]
        report["flicker"].extend(got["flicker"])
    text = json.dumps(report, indent=2)
    write_bytes_atomic(args.out, (text + "\n").encode("utf-8"))
    print(text)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
