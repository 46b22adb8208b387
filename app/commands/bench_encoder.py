"""`swapcast bench encoder`: live H.264 encode time against quality (PSNR/SSIM) per x264 preset, JSON out."""

import argparse
from typing import cast, get_args

from app.commands.arguments import counts, int_between, names_from
from app.commands.bench_args import check_bench_args, print_report
from app.commands.options import add_output_argument, add_resolutions_argument
from app.settings import X264Preset


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("encoder", help="H.264 encode time vs PSNR/SSIM per x264 preset, JSON out")
    add_resolutions_argument(p, ("480p", "720p"))
    p.add_argument(
        "--presets",
        type=names_from(get_args(X264Preset), "preset"),
        default=("ultrafast", "superfast", "veryfast", "faster", "medium"),
        help="comma list of x264 presets",
    )
    p.add_argument("--threads", type=counts(0, 16), default=(1, 0), help="comma list of encoder threads (0: auto)")
    p.add_argument("--frames", type=int_between(30, 3000), default=90, help="frames per row (default 90)")
    add_output_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.encoder_bench import RESOLUTIONS, EncoderBenchConfig, run_encoder_bench

    check_bench_args(args.resolutions, RESOLUTIONS, args.output)
    config = EncoderBenchConfig(
        resolutions=tuple(args.resolutions),
        presets=cast(tuple[X264Preset, ...], tuple(args.presets)),
        threads=tuple(args.threads),
        frames=args.frames,
    )
    return print_report(run_encoder_bench(config), args.output)
