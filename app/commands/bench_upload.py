"""`swapcast bench upload`: peak memory and time of decoding hostile identity photos."""

import argparse
import json

from app.errors import UserError


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("upload", help="peak RSS and time per hostile identity photo, each in a fresh process")
    p.add_argument(
        "--max-pixels",
        type=int,
        default=None,
        help="pixel limit to test (default: the server's SWAPCAST_MAX_IMAGE_PIXELS)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.upload_bench import run_upload_bench
    from app.server.settings import ServerSettings

    max_pixels = args.max_pixels if args.max_pixels is not None else ServerSettings().max_image_pixels
    if not 64 * 64 <= max_pixels <= 100_000_000:
        raise UserError("--max-pixels must be between 4096 and 100000000")
    print(json.dumps(run_upload_bench(max_pixels), indent=2))
    return 0
