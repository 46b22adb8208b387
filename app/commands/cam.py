"""`swapcast cam`: this machine's camera through a swapcast server (which swaps the face) into a virtual camera
that video calls can pick, or a window. For a laptop that cannot swap by itself."""

import argparse
import getpass
import os
import sys
from urllib.parse import urlsplit

from app.commands.arguments import http_url, one_of, positive_float, positive_int, video_size
from app.commands.from_args import picked


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from app.cam.sinks import OUTPUTS

    p = sub.add_parser("cam", help="a camera through a swapcast server into a virtual camera for video calls")
    p.add_argument(
        "--server", type=http_url, required=True, help="the server's base URL, e.g. https://swap.example.com"
    )
    p.add_argument("--identity", default=None, help="the identity (id) whose face replaces yours")
    p.add_argument("--channel", default=None, help="also publish into this channel of yours (RTSP, WHEP viewers)")
    p.add_argument(
        "--camera",
        default="0",
        help="a camera (index or device: /dev/video0, 0, 'FaceTime HD Camera') or a video file, looped (default 0)",
    )
    p.add_argument("--size", type=video_size, default=None, help="the camera's picture size, WxH (default its own)")
    p.add_argument("--fps", type=positive_int, default=None, help="the camera's frame rate (a file plays at its own)")
    p.add_argument(
        "--output",
        type=one_of(OUTPUTS, "output"),
        default="virtual",
        help="virtual: a virtual camera (pip install 'swapcast[cam]'); window: an OpenCV window; none: nothing shown",
    )
    p.add_argument("--seconds", type=positive_float, default=None, help="stop after this long (default: Ctrl-C)")
    p.add_argument("--key", default=None, help="an API key with the sessions scope (default SWAPCAST_API_KEY)")
    p.add_argument(
        "--measure",
        action="store_true",
        help="stamp frame ids into the picture's corner to measure the latency from camera to sink (visible)",
    )
    p.add_argument(
        "--stats-every", type=positive_float, default=None, metavar="S", help="print the counts every S seconds"
    )
    p.set_defaults(func=run)


def _ask_key() -> str | None:
    if not sys.stdin.isatty():
        return None
    return getpass.getpass("The server wants an API key (sessions scope): ").strip() or None


def run(args: argparse.Namespace) -> int:
    from app.auth.settings import is_loopback
    from app.cam.run import CamOptions, run_cam
    from app.cam.sinks import make_sink
    from app.cam.stats import CamStats
    from app.media.peer import use_host_addresses

    options = CamOptions(
        **picked(args, "server", "camera", "identity", "channel", "size", "fps", "seconds"),
        key=args.key or os.environ.get("SWAPCAST_API_KEY") or None,
        measure=args.measure,
        stats_every_s=args.stats_every or None,
    )
    if is_loopback(urlsplit(args.server).hostname or ""):
        use_host_addresses(["127.0.0.1"])  # a server on this machine: media over loopback, which aioice never offers
    stats = CamStats()
    try:
        run_cam(options, make_sink(args.output), stats, _ask_key)
    except KeyboardInterrupt:
        print("swapcast cam: stopped", file=sys.stderr)
    print(stats.line())
    return 0
