"""`swapcast bench-batch`: shared dynamic batching vs one model call per frame, N live sessions."""

import argparse
import json
import sys
from pathlib import Path

from app.errors import UserError


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("bench-batch", help="N simulated 30 fps sessions: batched vs unbatched, JSON out")
    p.add_argument("--networks", default="reference_swapper_narrow,reference_swapper_full")
    p.add_argument("--sessions", default="1,2,4,8", help="comma list of session counts")
    p.add_argument("--seconds", type=float, default=None, help="seconds per cell (default 4 narrow, 10 full)")
    p.add_argument("--max-batch", type=int, default=8)
    p.add_argument("--max-delay-ms", type=float, default=4.0)
    p.add_argument("--output", type=Path, default=None, help="also write the JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.batch_bench import BatchBenchConfig, run_batch_bench

    networks = tuple(n.strip() for n in args.networks.split(",") if n.strip())
    try:
        sessions = tuple(int(n) for n in args.sessions.split(","))
    except ValueError:
        raise UserError("--sessions takes a comma list of numbers, e.g. 1,2,4,8") from None
    if not networks or any(n < 1 for n in sessions) or args.max_batch < 1:
        raise UserError("need at least one network, session counts >= 1 and --max-batch >= 1")
    config = BatchBenchConfig(
        networks=networks, sessions=sessions, max_batch=args.max_batch, max_delay_ms=args.max_delay_ms
    )
    if args.seconds:
        config = BatchBenchConfig(
            networks=networks,
            sessions=sessions,
            max_batch=args.max_batch,
            max_delay_ms=args.max_delay_ms,
            seconds={n: args.seconds for n in networks},
        )
    text = json.dumps(run_batch_bench(config), indent=2)
    if args.output:
        args.output.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0
