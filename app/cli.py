"""`swapcast` console script: one sub-command module per job, user errors printed as one line."""

import argparse
import logging
import sys
from collections.abc import Sequence
from importlib import metadata
from typing import NoReturn, cast

from pydantic import ValidationError

from app.commands import COMMANDS
from app.commands.bench_group import legacy_argv
from app.errors import ModelError, UserError, invalid_setting


class _OneLineParser(argparse.ArgumentParser):
    """Usage mistakes (including every value `app.commands.arguments` refuses) get the same single error line
    as every other failure, and exit status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"swapcast: error: {message} (see `{self.prog} --help`)\n")


def installed_version() -> str:
    """The installed distribution's version (a source tree that was never installed has none)."""
    try:
        return metadata.version("swapcast")
    except metadata.PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="swapcast", description="Real-time face swap: files, benchmarks, models.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug messages")
    parser.add_argument("--version", action="version", version=f"swapcast {installed_version()}")
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser),
    )
    for register in COMMANDS:
        register(sub)
    # Only commands registered with help are listed; the others are older spellings kept for scripts.
    sub.metavar = "{" + ",".join(choice.dest for choice in sub._choices_actions) + "}"
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(legacy_argv(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
    except (UserError, ModelError) as exc:
        print(f"swapcast: error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:  # a SWAPCAST_ variable the settings refuse
        print(f"swapcast: error: {invalid_setting(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("swapcast: interrupted", file=sys.stderr)
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
