"""`swapcast bench watermark`: the invisible watermark's robustness, invisibility, false positives and cost."""

import argparse
from pathlib import Path

from app.commands.arguments import comma_list
from app.commands.bench_args import print_report
from app.commands.options import add_output_argument
from app.errors import UserError


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("watermark", help="watermark robustness (H.264, resize, crop), PSNR, cost; JSON out")
    p.add_argument("--photos", default="astronaut,tom_hanks,t1", help="comma list of sample photos for clips")
    p.add_argument("--seconds", type=int, default=2, help="seconds of 30 fps 720p video per photo (default 2)")
    p.add_argument("--strength", type=float, default=None, help="RMS grey levels of the mark (default 1.8)")
    p.add_argument("--grid", type=Path, default=Path("watermark-crops.png"), help="PNG of marked vs unmarked crops")
    add_output_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.watermark_bench import WatermarkBenchConfig, run_watermark_bench
    from app.provenance.embed import DEFAULT_STRENGTH

    photos = comma_list(args.photos)
    if not photos:
        raise UserError("--photos needs at least one name")
    if args.seconds < 1:
        raise UserError("--seconds must be at least 1")
    strength = DEFAULT_STRENGTH if args.strength is None else args.strength
    if not 0 < strength <= 8:
        raise UserError("--strength must be within (0, 8]")
    if args.grid.suffix.lower() != ".png":
        raise UserError("--grid must end in .png")
    config = WatermarkBenchConfig(photos=photos, seconds=args.seconds, strength=strength, grid=args.grid)
    try:
        result = run_watermark_bench(config)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    return print_report(result, args.output)
