"""What the benchmark commands share: checks made in `run` once the bench's own tables are imported (the
benches import lazily: `swapcast --help` must not load models and codecs), a run's failure as the user's
error, and the JSON report's printing."""

import json
import sys
from collections.abc import Callable, Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

from app.errors import UserError


def check_bench_args(resolutions: Iterable[str], known: Collection[str], output: Path | None) -> None:
    """Refuse an unknown resolution, and a JSON output whose folder is missing, before any work starts."""
    unknown = [r for r in resolutions if r not in known]
    if unknown:
        raise UserError(f"unknown resolution {unknown[0]!r}; choose from {', '.join(known)}")
    if output is not None and not output.parent.is_dir():
        raise UserError(f"output directory does not exist: {output.parent}")


def chosen(requested: tuple[str, ...], known: Collection[str], noun: str) -> tuple[str, ...]:
    """`requested` when it names at least one of `known` and nothing else; else the user's error."""
    unknown = [name for name in requested if name not in known]
    if unknown or not requested:
        raise UserError(f"unknown {noun} {unknown[0] if unknown else ''!r}; choose from {', '.join(known)}")
    return requested


def print_report(result: object, output: Path | None) -> int:
    """`result` as indented JSON, written to `output` (when given) and then to stdout; the exit status."""
    text = json.dumps(result, indent=2)
    if output:
        output.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    return 0


def run_and_report(
    run: Callable[[bool], dict[str, Any]], table: Callable[[dict[str, Any]], str], output: Path | None
) -> int:
    """`run(progress)` (progress shown on a terminal), its `RuntimeError` as the user's error, its `table` on
    stderr, then its report as `print_report` prints it."""
    try:
        result = run(sys.stderr.isatty())
    except RuntimeError as exc:
        raise UserError(str(exc)) from None
    print(table(result), file=sys.stderr)
    return print_report(result, output)


def text_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Left-aligned columns two spaces apart, a header line first (`None` shows as "-")."""
    cells = [["-" if value is None else str(value) for value in row] for row in rows]
    widths = [max(len(title), *(len(row[i]) for row in cells)) for i, title in enumerate(header)]
    lines = [header, *cells]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(line, widths, strict=True)).rstrip() for line in lines)
