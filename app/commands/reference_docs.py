"""The generated reference pages of the docs site: settings (from the settings classes), the command line (from
the argument parser), metrics (from the registries) and HTTP operations (from the OpenAPI document).
`python -m app.commands.reference_docs` writes them; `--check` exits 1 when a page on disk is stale
(tests/commands/test_reference_docs.py runs the same check)."""

import argparse
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

DOCS = Path(__file__).resolve().parents[2] / "docs" / "reference"
HELP_WIDTH = "100"  # argparse wraps help to $COLUMNS; fixed so the page does not depend on the terminal


def _parsers(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                if sub.prog == f"{name} {sub_name}":  # an older spelling shares its parser: documented once
                    yield from _parsers(sub, f"{name} {sub_name}")


def cli_markdown() -> str:
    from app.cli import build_parser

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = HELP_WIDTH
    try:
        sections = [(name, p.format_help().rstrip()) for name, p in _parsers(build_parser(), "swapcast")]
    finally:
        if saved is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = saved
    lines = [
        "# Command line",
        "",
        "<!-- Generated from the argument parser by `python -m app.commands.reference_docs`; do not edit. -->",
        "",
        "Every command prints one `swapcast: error: ...` line and exits non-zero on bad input; every option that",
        "is also a setting can be given as its `SWAPCAST_` variable ([settings](settings.md)).",
    ]
    for name, text in sections:
        lines += ["", f"## {name}", "", "```text", text, "```"]
    return "\n".join(lines) + "\n"


def metrics_markdown() -> str:
    from prometheus_client import CollectorRegistry

    from app.identity.cache import IdentityCache
    from app.observability import Metrics
    from app.runtime.batcher.metrics import BatcherMetrics

    registry = CollectorRegistry()
    Metrics(registry)
    BatcherMetrics(registry, "swap", lambda: 0)
    IdentityCache(lambda identity, model: identity, registry=registry)
    lines = [
        "# Metrics reference",
        "",
        "<!-- Generated from the metric registries by `python -m app.commands.reference_docs`; do not edit. -->",
        "",
        "What `GET /metrics` exports ([Metrics](../operations/metrics.md) says how to scrape it). Counters carry",
        "the `_total` suffix on the wire; histograms their `_bucket`, `_sum` and `_count` series.",
        "",
        "| metric | type | help |",
        "|---|---|---|",
    ]
    for family in sorted(registry.collect(), key=lambda f: f.name):
        documentation = family.documentation.replace("|", "\\|")
        lines.append(f"| `{family.name}` | {family.type} | {documentation} |")
    return "\n".join(lines) + "\n"


def openapi_markdown() -> str:
    from app.auth.settings import AccessSettings
    from app.server.app import create_app
    from app.server.settings import ServerSettings

    with tempfile.TemporaryDirectory() as scratch:  # the app is built, never started: nothing is written here
        settings = ServerSettings(
            identity_dir=Path(scratch) / "identities", access=AccessSettings(keys_file=Path(scratch) / "keys.json")
        )
        spec = create_app(settings).openapi()
    lines = [
        "# HTTP operations",
        "",
        "<!-- Generated from the OpenAPI document by `python -m app.commands.reference_docs`; do not edit. -->",
        "",
        "Every operation of the API as the server's OpenAPI document states it (a running server serves the",
        "document at `/openapi.json` and an explorer at `/docs`). *bearer*: needs a key or JWT unless the server",
        "runs in local mode ([Access control](../operations/access-control.md)).",
        "",
        "| method | path | what | auth |",
        "|---|---|---|---|",
    ]
    for path, operations in spec["paths"].items():
        for method, operation in operations.items():
            description = " ".join(operation.get("description", "").split())
            what = f"{operation['summary']}: {description}" if description else operation["summary"]
            what = what.replace("|", "\\|")
            auth = "bearer" if operation.get("security") else "open"
            lines.append(f"| {method.upper()} | `{path}` | {what} | {auth} |")
    return "\n".join(lines) + "\n"


def pages() -> dict[str, str]:
    from app.settings_catalog import settings_markdown

    return {
        "settings.md": settings_markdown(),
        "cli.md": cli_markdown(),
        "metrics.md": metrics_markdown(),
        "openapi.md": openapi_markdown(),
    }


def stale(docs: Path = DOCS) -> list[str]:
    return [name for name, text in pages().items() if not (docs / name).is_file() or (docs / name).read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.commands.reference_docs", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 when a generated page is stale")
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"docs/reference/{name} is stale: run python -m app.commands.reference_docs", file=sys.stderr)
        return 1 if names else 0
    for name, text in pages().items():
        (DOCS / name).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
