"""`swapcast bench mesh`: the mesh engine's cost per face, step by step, beside classic's, and whole frames."""

import argparse
import json
import sys
from pathlib import Path

from app.errors import UserError


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("mesh", help="mesh engine cost per face and per 480p frame, beside classic")
    p.add_argument("--runs", type=int, default=60, help="timed runs per engine and resolution")
    p.add_argument("--out", type=Path, default=None, help="write the JSON here (default: print it)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.runs < 1:
        raise UserError("--runs must be at least 1")
    from app.bench.mesh_speed import run_mesh_speed
    from app.model_store import open_model_store

    text = json.dumps(run_mesh_speed(open_model_store(), runs=args.runs), indent=2) + "\n"
    if args.out is None:
        sys.stdout.write(text)
        return 0
    from engines.atomic import write_bytes_atomic

    write_bytes_atomic(args.out, text.encode("utf-8"))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0
