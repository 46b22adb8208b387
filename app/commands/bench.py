"""`swapcast bench pipeline`: per-stage pipeline latency against the reference path, JSON out."""

import argparse

from app.commands.arguments import counts, positive_int
from app.commands.bench_args import check_bench_args, print_report
from app.commands.from_args import picked
from app.commands.options import add_output_argument, add_resolutions_argument


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("pipeline", help="per-stage latency p50/p99, ours vs the insightface reference path")
    p.add_argument("--swapper-model", default="reference_swapper_full", help="inswapper-contract model name")
    p.add_argument("--recognizer-model", default="reference_recognizer")
    p.add_argument("--enhancer", default=None, help="Real-ESRGAN model name to include the enhance stage")
    p.add_argument("--frames", type=positive_int, default=4, help="frames per scenario")
    add_resolutions_argument(p, ("720p", "1080p"))
    p.add_argument("--faces", type=counts(1, 6), default=(1, 3), help="comma list of face counts (1 to 6)")
    p.add_argument("--threads", type=positive_int, default=None, help="inference threads (default: all cores)")
    p.add_argument("--no-reference", action="store_true", help="skip the reference path")
    add_output_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.pipeline_bench import BenchConfig, run_bench
    from app.bench.scenes import RESOLUTIONS
    from app.model_store import open_model_store

    check_bench_args(args.resolutions, RESOLUTIONS, args.output)
    config = BenchConfig(
        **picked(args, "swapper_model", "recognizer_model", "frames", "resolutions"),
        enhancer_model=args.enhancer,
        face_counts=args.faces,
        reference=not args.no_reference,
        **({"threads": args.threads} if args.threads else {}),
    )
    return print_report(run_bench(config, open_model_store()), args.output)
