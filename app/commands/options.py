"""Options that several commands register, written once so their flags and help read the same everywhere."""

import argparse
from pathlib import Path

from app.commands.arguments import comma_list, int_between, names, one_of, port
from app.names import SWAP_ENGINE_CHOICES, SWAP_ENGINES


def add_output_argument(p: argparse.ArgumentParser) -> None:
    """A benchmark's `--output`: a file that gets the JSON report as well."""
    p.add_argument("--output", type=Path, default=None, help="also write the JSON here")


def add_engine_argument(p: argparse.ArgumentParser) -> None:
    """`--engine`, left None when not given so the settings (SWAPCAST_ENGINE, then auto) decide."""
    p.add_argument(
        "--engine",
        choices=SWAP_ENGINE_CHOICES,
        default=None,
        help="swap engine (default SWAPCAST_ENGINE, else auto: inswapper when its weights are present, else mesh)",
    )


def add_serving_arguments(p: argparse.ArgumentParser) -> None:
    """`swapcast serve`'s `--host`, `--port` and `--identity-dir`; `swapcast doctor` takes the same to check what
    serve would do with them. None when not given, so the settings decide."""
    p.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--port", type=port, default=None, help="HTTP port (default 8000; 0 picks a free one)")
    p.add_argument("--identity-dir", type=Path, default=None, help="where identities are stored")


def add_fps_argument(p: argparse.ArgumentParser, default: int, sender: str) -> None:
    """A streaming benchmark's `--fps`: the rate `sender` sends at."""
    p.add_argument(
        "--fps", type=int_between(1, 60), default=default, help=f"frames per second {sender} sends (default {default})"
    )


def add_resolution_argument(p: argparse.ArgumentParser) -> None:
    """A streaming benchmark's one `--resolution` (checked in `run` against app.bench.server_bench's)."""
    p.add_argument("--resolution", default="480p", help="480p or 720p (default 480p)")


def add_resolutions_argument(p: argparse.ArgumentParser, default: tuple[str, ...]) -> None:
    """A benchmark's `--resolutions`, a comma list checked in `run` against the bench's own table."""
    p.add_argument("--resolutions", type=names, default=default, help=f"comma list: {','.join(default)}")


def add_server_engine_argument(p: argparse.ArgumentParser) -> None:
    """The swap engine of the server a streaming benchmark starts: mesh unless asked, as users get."""
    p.add_argument(
        "--engine",
        type=one_of(SWAP_ENGINES, "engine"),
        default="mesh",
        help="the server's swap engine (default mesh, the one users get)",
    )


def add_engine_list_argument(p: argparse.ArgumentParser, help: str) -> None:
    """A quality benchmark's `--engines`: a comma list that `run` checks against the engines it measures (None:
    the bench's default)."""
    p.add_argument("--engines", type=comma_list, default=None, help=help)
