"""Options that several commands register, written once so their flags and help read the same everywhere."""

import argparse
from pathlib import Path

from app.names import SWAP_ENGINE_CHOICES


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
