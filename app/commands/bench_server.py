"""`swapcast bench server`: round-trip latency and fps of WebRTC sessions, our server against a bare aiortc echo."""

import argparse
import sys

from app.commands.arguments import counts, names_from, non_negative_float, one_of, positive_float
from app.commands.bench_args import check_bench_args, print_report
from app.commands.from_args import picked
from app.commands.options import add_fps_argument, add_output_argument, add_resolutions_argument
from app.names import SWAP_ENGINES

CODECS = ("H264", "VP8")


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("server", help="WebRTC round-trip latency and fps: our server vs a bare aiortc echo")
    p.add_argument("--seconds", type=positive_float, default=3.0, help="measured seconds per cell (default 3)")
    p.add_argument(
        "--warmup", type=non_negative_float, default=1.5, help="seconds streamed before measuring (default 1.5)"
    )
    p.add_argument("--sessions", type=counts(1, 16), default=(1, 2, 4), help="comma list of concurrent sessions")
    add_resolutions_argument(p, ("480p", "720p"))
    p.add_argument(
        "--engines",
        type=names_from(SWAP_ENGINES, "engine"),
        default=("passthrough", "classic", "mesh"),
        help="comma list of swap engines (default passthrough,classic,mesh; mesh is the one users get)",
    )
    p.add_argument("--no-echo", action="store_true", help="skip the bare aiortc echo server")
    p.add_argument(
        "--codec", type=one_of(CODECS, "codec", upper=True), default="H264", help="H264 or VP8 (default H264)"
    )
    add_fps_argument(p, 30, "each client")
    p.add_argument(
        "--no-face-lost", action="store_true", help="skip counting frames that reveal the real face (~1 min)"
    )
    p.add_argument(
        "--echo-encoder",
        type=one_of(("aiortc", "live"), "echo encoder"),
        default="aiortc",
        help="the echo's H.264 encoder: aiortc's own (default) or swapcast's (the difference is then the server)",
    )
    p.add_argument(
        "--client-encoder",
        type=one_of(("live", "aiortc"), "client encoder"),
        default="live",
        help="how the clients encode: real time as a browser does (default), or aiortc's libx264 medium",
    )
    p.add_argument(
        "--no-rtsp-ingest",
        action="store_true",
        help="skip the RTSP-ingest cell (a stream from a local RTSP source, per engine and resolution)",
    )
    p.add_argument("--in-process", action="store_true", help="run the servers in this process's threads, not their own")
    add_output_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from app.bench.server_bench import RESOLUTIONS, ServerBenchConfig, run_server_bench

    check_bench_args(args.resolutions, RESOLUTIONS, args.output)
    config = ServerBenchConfig(
        **picked(args, "seconds", "warmup", "sessions", "codec", "fps", "echo_encoder", "client_encoder", "in_process"),
        resolutions=tuple(args.resolutions),
        engines=tuple(args.engines),
        echo=not args.no_echo,
        face_lost=not args.no_face_lost,
        rtsp_ingest=not args.no_rtsp_ingest,
    )
    return print_report(run_server_bench(config, progress=sys.stderr.isatty()), args.output)
