"""`swapcast bench`: per-stage pipeline latency against the reference path, JSON out."""

import argparse
import json
import sys
from pathlib import Path

from app.errors import UserError


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("bench", help="per-stage latency p50/p99, ours vs the insightface reference path")
    p.add_argument("--swapper-model", default="reference_swapper_full", help="inswapper-contract model name")
    p.add_argument("--recognizer-model", default="reference_recognizer")
    p.add_argument("--enhancer", default=None, help="Real-ESRGAN model name to include the enhance stage")
    p.add_argument("--frames", type=int, default=4, help="frames per scenario")
    p.add_argument("--resolutions", type=_csv, default=("720p", "1080p"), help="comma list: 720p,1080p")
    p.add_argument("--faces", type=_csv, default=("1", "3"), help="comma list of face counts")
    p.add_argument("--threads", type=int, default=None, help="inference threads (default: all cores)")
    p.add_argument("--no-reference", action="store_true", help="skip the reference path")
    p.add_argument("--output", type=Path, default=None, help="also write the JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.pipeline_bench import BenchConfig, run_bench
    from app.bench.scenes import RESOLUTIONS

    unknown = [r for r in args.resolutions if r not in RESOLUTIONS]
    if unknown:
        raise UserError(f"unknown resolution {unknown[0]!r}; choose from {', '.join(RESOLUTIONS)}")
    try:
        counts = tuple(int(c) for c in args.faces)
    except ValueError:
        raise UserError("--faces takes a comma list of numbers, e.g. 1,3") from None
    if args.frames < 1 or any(not 1 <= c <= 6 for c in counts):
        raise UserError("--frames must be at least 1 and face counts between 1 and 6")
    config = BenchConfig(
        swapper_model=args.swapper_model,
        recognizer_model=args.recognizer_model,
        enhancer_model=args.enhancer,
        frames=args.frames,
        resolutions=args.resolutions,
        face_counts=counts,
        reference=not args.no_reference,
        **({"threads": args.threads} if args.threads else {}),
    )
    report = run_bench(config)
    text = json.dumps(report, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0
