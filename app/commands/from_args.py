"""Parsed options handed on by name, for the commands whose options are named as the fields they fill."""

import argparse
from typing import Any


def picked(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """`{name: args.name}` for each of `names`, to pass on as keyword arguments."""
    return {name: getattr(args, name) for name in names}
