"""`swapcast bench-server`: round-trip latency and fps of WebRTC sessions, our server against a bare aiortc echo."""

import argparse
import json
import sys
from pathlib import Path

from app.errors import UserError

CODECS = ("H264", "VP8")
ENGINES = ("passthrough", "classic", "inswapper")


def _csv(value: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in value.split(",") if part.strip())


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("bench-server", help="WebRTC round-trip latency and fps: our server vs a bare aiortc echo")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per cell (default 3)")
    p.add_argument("--warmup", type=float, default=1.5, help="seconds streamed before measuring (default 1.5)")
    p.add_argument("--sessions", type=_csv, default=("1", "2", "4"), help="comma list of concurrent sessions")
    p.add_argument("--resolutions", type=_csv, default=("480p", "720p"), help="comma list: 480p,720p")
    p.add_argument("--engines", type=_csv, default=("passthrough", "classic"), help="comma list of engines")
    p.add_argument("--no-echo", action="store_true", help="skip the bare aiortc echo server")
    p.add_argument("--codec", default="H264", help="H264 or VP8 (default H264)")
    p.add_argument("--fps", type=int, default=30, help="frames per second each client sends (default 30)")
    p.add_argument("--output", type=Path, default=None, help="also write the JSON here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.server_bench import RESOLUTIONS, ServerBenchConfig, run_server_bench

    unknown = [r for r in args.resolutions if r not in RESOLUTIONS]
    if unknown:
        raise UserError(f"unknown resolution {unknown[0]!r}; choose from {', '.join(RESOLUTIONS)}")
    bad_engine = [e for e in args.engines if e not in ENGINES]
    if bad_engine:
        raise UserError(f"unknown engine {bad_engine[0]!r}; choose from {', '.join(ENGINES)}")
    codec = args.codec.upper()
    if codec not in CODECS:
        raise UserError(f"unknown codec {args.codec!r}; choose from {', '.join(CODECS)}")
    try:
        sessions = tuple(int(s) for s in args.sessions)
    except ValueError:
        raise UserError("--sessions takes a comma list of numbers, e.g. 1,2,4") from None
    if not sessions or any(not 1 <= s <= 16 for s in sessions):
        raise UserError("--sessions must be between 1 and 16")
    if args.seconds <= 0 or args.warmup < 0:
        raise UserError("--seconds must be positive and --warmup not negative")
    if not 1 <= args.fps <= 60:
        raise UserError("--fps must be between 1 and 60")
    if args.output is not None and not args.output.parent.is_dir():
        raise UserError(f"output directory does not exist: {args.output.parent}")
    config = ServerBenchConfig(
        seconds=args.seconds,
        warmup=args.warmup,
        sessions=sessions,
        resolutions=tuple(args.resolutions),
        engines=tuple(args.engines),
        echo=not args.no_echo,
        codec=codec,
        fps=args.fps,
    )
    result = run_server_bench(config, progress=sys.stderr.isatty())
    text = json.dumps(result, indent=2)
    print(text)
    if args.output is not None:
        args.output.write_text(text + "\n", encoding="utf-8")
    return 0
