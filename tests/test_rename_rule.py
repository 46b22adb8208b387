"""Rules about the code's structure, checked on the source of `app/` and `engines/` with `ast` (nothing imported).

Each rule is a function from a parsed module to the offending lines, tested once on the real tree and once on
snippets that must and must not trip it, so a rule cannot pass by never matching anything.

Renames: only `engines/atomic.py` renames files, so every file and folder that appears under its final name
is flushed to disk first and gets ordinary permissions (see that module). A module breaks the rule when it
calls
  * `os.replace`, `os.rename`, `os.renames` or `shutil.move`, through the module or through names imported
    from it (`from os import replace`);
  * `.rename(...)` on anything: nothing else in the code base has a method of that name;
  * `.replace(x)` with exactly one argument and no keywords: that is `Path.replace(target)`. `str.replace`
    needs at least two arguments and `datetime.replace` / `dataclasses.replace` take keywords, so those
    stay legitimate.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engines")
RENAMES_ALLOWED_IN = frozenset({"engines/atomic.py"})
RENAMING_FUNCTIONS = {"os": {"replace", "rename", "renames"}, "shutil": {"move"}}


def source_files() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def relative(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def renames(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, call) for every call in `tree` that renames a file (see the module notes)."""
    module_aliases: dict[str, str] = {}  # local name -> "os" / "shutil"
    function_aliases: dict[str, str] = {}  # local name -> "os.replace"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in RENAMING_FUNCTIONS:
                    module_aliases[alias.asname or alias.name] = alias.name
        elif isinstance(node, ast.ImportFrom) and node.module in RENAMING_FUNCTIONS:
            for alias in node.names:
                if alias.name in RENAMING_FUNCTIONS[node.module]:
                    function_aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in function_aliases:
            found.append((node.lineno, function_aliases[func.id]))
        elif isinstance(func, ast.Attribute):
            owner = func.value.id if isinstance(func.value, ast.Name) else None
            module = module_aliases.get(owner or "")
            if module is not None and func.attr in RENAMING_FUNCTIONS[module]:
                found.append((node.lineno, f"{module}.{func.attr}"))
            elif func.attr == "rename":
                found.append((node.lineno, ".rename()"))
            elif func.attr == "replace" and len(node.args) == 1 and not node.keywords:
                found.append((node.lineno, "Path.replace()"))
    return sorted(found)


def test_only_the_atomic_helpers_rename_files() -> None:
    offenders = [
        f"{relative(path)}:{line}: {call}"
        for path in source_files()
        if relative(path) not in RENAMES_ALLOWED_IN
        for line, call in renames(parse(path))
    ]
    assert not offenders, "rename through engines.atomic (durable, ordinary permissions):\n" + "\n".join(offenders)


def test_the_atomic_helpers_are_where_the_renames_are() -> None:
    """The allowed module really renames: the scan sees it, so it would see any other."""
    for allowed in RENAMES_ALLOWED_IN:
        assert renames(parse(ROOT / allowed)), f"{allowed} renames nothing the scan recognises"


@pytest.mark.parametrize(
    "snippet",
    [
        "import os\nos.replace(a, b)",
        "import os\nos.rename(a, b)",
        "import os as system\nsystem.renames(a, b)",
        "from os import replace\nreplace(a, b)",
        "from os import rename as move_it\nmove_it(a, b)",
        "import shutil\nshutil.move(a, b)",
        "from shutil import move\nmove(a, b)",
        "Path(a).rename(b)",
        "tmp.replace(dst)",
        "Path(a).replace(dst)",
    ],
)
def test_the_rename_scan_catches(snippet: str) -> None:
    assert renames(ast.parse(snippet))


@pytest.mark.parametrize(
    "snippet",
    [
        "text.replace('a', 'b')",
        "f'{x}'.replace(old, new, 1)",
        "from dataclasses import replace\nreplace(config, size=3)",
        "dataclasses.replace(config, size=3)",
        "moment.replace(tzinfo=None)",
        "import os\nos.remove(a)",
        "import shutil\nshutil.copy(a, b)",
    ],
)
def test_the_rename_scan_leaves_alone(snippet: str) -> None:
    assert not renames(ast.parse(snippet))
