"""`swapcast bench return-loss`: a session's return sender through a seeded lossy link to receivers that do
nothing to repair it (a plain aiortc client, optionally headless Chromium), its recovery off and on side by
side; the longest freeze per seed, inter-frame gaps, frames held behind a hole, NACKs and resends."""

import argparse
from typing import Any

from app.commands.arguments import counts, names_from, non_negative_float, positive_float
from app.commands.bench_args import check_bench_args, run_and_report, text_table
from app.commands.from_args import picked
from app.commands.options import add_fps_argument, add_output_argument, add_resolution_argument

RECEIVERS = ("aiortc", "chromium")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser(
        "return-loss",
        help="a session's return through loss to receivers that cannot repair it, its recovery off and on",
    )
    p.add_argument(
        "--receivers",
        type=names_from(RECEIVERS, "receiver"),
        default=("aiortc",),
        help="comma list of aiortc (a plain aiortc client) and chromium (headless Chromium at /usr/bin/chromium, "
        "through Playwright); default aiortc",
    )
    p.add_argument(
        "--loss",
        type=counts(1, 50),
        default=(1, 5),
        help="comma list of percentages of datagrams lost, each direction (default 1,5)",
    )
    p.add_argument(
        "--seeds", type=counts(0), default=(1, 2, 3), help="comma list of the relay's loss seeds (default 1,2,3)"
    )
    p.add_argument("--seconds", type=positive_float, default=20.0, help="seconds of loss per run (default 20)")
    p.add_argument(
        "--warmup", type=non_negative_float, default=2.0, help="clean seconds streamed before each run (default 2)"
    )
    add_resolution_argument(p)
    add_fps_argument(p, 25, "the server")
    add_output_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.return_loss import ReturnLossConfig, run_return_loss_bench
    from app.bench.server_bench import RESOLUTIONS

    check_bench_args([args.resolution], RESOLUTIONS, args.output)
    config = ReturnLossConfig(
        **picked(args, "seconds", "warmup", "resolution", "fps"),
        receivers=tuple(args.receivers),
        losses=tuple(percent / 100 for percent in args.loss),
        seeds=tuple(args.seeds),
    )
    return run_and_report(lambda progress: run_return_loss_bench(config, progress=progress), format_table, args.output)


def format_table(result: dict[str, Any]) -> str:
    header = ("RECEIVER", "LOSS", "RECOVERY", "LONGEST MS PER SEED", "HELD MS", "P50 MS", "P99 MS", "NACKS", "RESENT")
    rows = [
        (
            group["receiver"],
            f"{group['loss']:.0%}",
            "on" if group["recovery"] else "off",
            ",".join(str(v) for v in group["longest_freeze_ms"]),
            ",".join("-" if v is None else str(v) for v in group["held_behind_hole_ms"]),
            group["gap_ms"]["p50"],
            group["gap_ms"]["p99"],
            ",".join(str(v) for v in group["nacks"]),
            ",".join(str(v) for v in group["resent"]),
        )
        for group in result["groups"]
    ]
    config, machine = result["config"], result["machine"]
    load = machine["load_average_1m"]
    note = (
        f"{config['resolution']} at {config['fps']} fps, {config['seconds']:g} s of loss per run, seeds "
        f"{','.join(str(s) for s in config['seeds'])}, {machine['cpus']} CPUs, 1-minute load "
        f"{load['before']} -> {load['after']}; HELD: frames held behind a hole (aiortc's jitter buffer)"
    )
    return text_table(header, rows) + "\n" + note
