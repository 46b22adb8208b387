"""`swapcast bench NAME`: the one command group for the benchmarks. Each benchmark's module registers its own
parser under its short name; this module owns the group, the hidden `bench-NAME` spellings that scripts and
older docs use, and the older `swapcast bench [OPTIONS]` form of the pipeline benchmark."""

import argparse
from collections.abc import Sequence
from typing import cast

from app.commands import (
    bench,
    bench_batch,
    bench_content,
    bench_egress,
    bench_encoder,
    bench_engines,
    bench_mesh,
    bench_network,
    bench_quality,
    bench_return_loss,
    bench_server,
    bench_soak,
    bench_stability,
    bench_upload,
    bench_watermark,
)

BENCHMARKS = (
    bench,
    bench_batch,
    bench_server,
    bench_network,
    bench_return_loss,
    bench_soak,
    bench_egress,
    bench_encoder,
    bench_quality,
    bench_stability,
    bench_engines,
    bench_mesh,
    bench_upload,
    bench_watermark,
    bench_content,
)
ALIAS_PREFIX = "bench-"
PIPELINE = "pipeline"  # was `swapcast bench` itself before the group existed
NO_OLD_NAME = frozenset({PIPELINE, "egress"})  # benchmarks without a `bench-NAME` spelling to keep


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    group = sub.add_parser(
        "bench",
        help="benchmarks: `swapcast bench NAME --help` for one of them",
        description="Benchmarks; each prints or writes a JSON report. The older `bench-NAME` spellings still work.",
    )
    names = group.add_subparsers(dest="bench_command", required=True, metavar="NAME")
    for module in BENCHMARKS:
        module.register(names)
    # The old top-level names parse with the same parser object, so errors and --help point at the new name.
    # They are left out of the listing (cli.build_parser lists only commands with help).
    parsers = cast("dict[str, argparse.ArgumentParser]", sub.choices)
    for name, parser in cast("dict[str, argparse.ArgumentParser]", names.choices).items():
        if name not in NO_OLD_NAME:
            parsers[ALIAS_PREFIX + name] = parser


def legacy_argv(argv: Sequence[str]) -> list[str]:
    """`swapcast bench [OPTIONS]` (no NAME, no --help) meant the pipeline benchmark: keep that meaning."""
    args = list(argv)
    command = next((i for i, token in enumerate(args) if not token.startswith("-")), None)
    if command is None or args[command] != "bench":
        return args
    following = args[command + 1] if command + 1 < len(args) else None
    if following is None or (following.startswith("-") and following not in ("-h", "--help")):
        args.insert(command + 1, PIPELINE)
    return args
