"""`swapcast bench-batch`: shared dynamic batching vs one model call per frame, N live sessions."""

import argparse
import json
import sys
from pathlib import Path

from app.commands.arguments import counts, names, non_negative_float, positive_float, positive_int


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("bench-batch", help="N simulated 30 fps sessions: batched vs unbatched, JSON out")
    p.add_argument("--networks", type=names, default=("reference_swapper_narrow", "reference_swapper_full"))
    p.add_argument("--sessions", type=counts(1), default=(1, 2, 4, 8), help="comma list of session counts")
    p.add_argument("--seconds", type=positive_float, default=None, help="seconds per cell (default 4 narrow, 10 full)")
    p.add_argument("--max-batch", type=positive_int, default=8)
    p.add_argument("--max-delay-ms", type=non_negative_float, default=4.0)
    p.add_argument("--output", type=Path, default=None, help="also write the JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.batch_bench import BatchBenchConfig, run_batch_bench
    from app.model_store import open_model_store

    config = BatchBenchConfig(
        networks=args.networks, sessions=args.sessions, max_batch=args.max_batch, max_delay_ms=args.max_delay_ms
    )
    if args.seconds is not None:
        config = BatchBenchConfig(
            networks=args.networks,
            sessions=args.sessions,
            max_batch=args.max_batch,
            max_delay_ms=args.max_delay_ms,
            seconds={n: args.seconds for n in args.networks},
        )
    text = json.dumps(run_batch_bench(config, open_model_store()), indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0
