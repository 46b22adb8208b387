"""`swapcast bench engines`: FP32/FP16/INT8/torch variants side by side: latency, size and quality vs FP32."""

import argparse
import json
import sys
from pathlib import Path

from app.commands.arguments import positive_int


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    bench = sub.add_parser(
        "engines", help="FP32/FP16/INT8/torch variants: latency, size and quality vs FP32 (table and JSON)"
    )
    bench.add_argument("--full", action="store_true", help="also the full-size reference swapper (slow on a CPU)")
    bench.add_argument("--runs", type=positive_int, default=30, help="timed runs per variant (default 30)")
    bench.add_argument("--threads", type=positive_int, default=None, help="threads per model (default: all cores)")
    bench.add_argument("--output", type=Path, default=None, help="write the JSON here instead of after the table")
    bench.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.engines_bench import EnginesBenchConfig, format_table, run_engines_bench
    from app.model_store import open_model_store

    config = EnginesBenchConfig(full=args.full, runs=args.runs, threads=args.threads)
    result = run_engines_bench(open_model_store(), config)
    print(format_table(result))
    text = json.dumps(result, indent=2)
    if args.output:
        args.output.write_text(text + "\n")
        print(f"JSON written to {args.output}")
    else:
        sys.stdout.write(text + "\n")
    return 0
