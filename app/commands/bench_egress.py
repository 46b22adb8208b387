"""`swapcast bench egress`: the server's CPU for one publisher into a channel, with no reader and with every kind
of reader (RTSP, SRT, WHEP, two RTMP pushes), per engine; optionally beside an older commit's server."""

import argparse
from pathlib import Path

from app.commands.arguments import positive_float, positive_int
from app.commands.bench_args import print_report
from app.errors import UserError

ENGINES = ("passthrough", "mesh")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("egress", help="server CPU for one channel publisher: no readers vs RTSP+SRT+WHEP+2 RTMP pushes")
    p.add_argument("--seconds", type=positive_float, default=20.0, help="measured seconds per cell (default 20)")
    p.add_argument("--warmup-s", type=positive_float, default=8.0, help="seconds streamed before measuring (default 8)")
    p.add_argument("--rounds", type=positive_int, default=2, help="times each cell is measured (default 2)")
    p.add_argument(
        "--engine",
        action="append",
        choices=(*ENGINES, "both"),
        default=None,
        help="the server's swap engine, repeatable, or both (default both)",
    )
    p.add_argument(
        "--baseline", default=None, metavar="REF", help="also measure this commit's server, interleaved with ours"
    )
    p.add_argument("--json-out", type=Path, default=None, help="also write the JSON report here")
    p.set_defaults(func=run)


def engines_of(chosen: list[str] | None) -> tuple[str, ...]:
    if not chosen or "both" in chosen:
        return ENGINES
    return tuple(dict.fromkeys(chosen))


def run(args: argparse.Namespace) -> int:
    from app.bench.egress_cost import EgressConfig, run_egress_bench

    if args.json_out is not None and not args.json_out.parent.is_dir():
        raise UserError(f"output directory does not exist: {args.json_out.parent}")
    config = EgressConfig(
        seconds=args.seconds,
        warmup_s=args.warmup_s,
        rounds=args.rounds,
        engines=engines_of(args.engine),
        baseline=args.baseline,
    )
    try:
        report = run_egress_bench(config)
    except RuntimeError as exc:
        raise UserError(str(exc)) from None
    return print_report(report, args.json_out)
