"""Import rules of the two packages, checked on the source with `ast` (nothing is imported):

* `engines/` (the model supply chain) never imports `app/`;
* only the CLI (`app/cli.py` and `app/commands/`) imports `app.commands`: use-cases live below the edges;
* `app.provenance` (the mark an output stage embeds) never imports `app.media`, which imports it: file tools
  built on media (C2PA manifests, scans) live above both, in `app.provenance_files`;
* the live core (`app.live`) never imports its transports (`app.media`, `app.egress`, `app.server`), and the
  egress (`app.egress`: outputs) never imports the server (`app.server`) nor the ingress's sessions;
* no module of `app/` or `engines/` is over 600 lines;
* no package of `app/` imports another that imports it back;
* no import cycles among the modules of `app/` and `engines/`. Imports inside functions count too: a lazy
  import hides a cycle from the interpreter, not from a reader. Imports under `if TYPE_CHECKING:` do not
  count (they never run).
"""

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

Graph = dict[str, set[str]]

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("app", "engines")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_only(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every module name an import statement reaches, outside `if TYPE_CHECKING:` blocks."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _type_checking_only(node):
            yield from (name for child in node.orelse for name in _imports(child, module, is_package))
            continue
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)  # `from pkg import module`
        yield from _imports(node, module, is_package)


def import_graph() -> Graph:
    """Module -> the modules of both packages it imports. Importing `pkg.mod` runs `pkg/__init__` first;
    those edges (from a module to a package above it) are left out, or every package whose __init__ imports
    a sub-module would be a cycle."""
    files = {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}
    graph: Graph = {module: set() for module in files}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for target in _imports(tree, module, path.name == "__init__.py"):
            if target in files and not _in(module, target):
                graph[module].add(target)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


@pytest.fixture(scope="module")
def graph() -> Graph:
    return import_graph()


def edges(graph: Graph) -> list[tuple[str, str]]:
    return sorted((source, target) for source, targets in graph.items() for target in targets)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(f"{package}.")


def test_the_graph_sees_the_packages(graph: Graph) -> None:
    assert "app.commands" in graph["app.cli"]
    assert "app.settings" in graph["app.pipeline.factory"]
    assert "engines.store" in graph["engines.fetch"]


def test_engines_never_imports_app(graph: Graph) -> None:
    upward = sorted((a, b) for a, b in edges(graph) if _in(a, "engines") and _in(b, "app"))
    assert upward == []


def test_only_the_cli_imports_the_commands(graph: Graph) -> None:
    def cli(module: str) -> bool:
        return module == "app.cli" or _in(module, "app.commands")

    outside = sorted((a, b) for a, b in edges(graph) if _in(b, "app.commands") and not cli(a))
    assert outside == []


def test_the_mark_sits_below_media(graph: Graph) -> None:
    upward = sorted((a, b) for a, b in edges(graph) if _in(a, "app.provenance") and _in(b, "app.media"))
    assert upward == []


def test_media_and_provenance_never_import_each_other_both_ways(graph: Graph) -> None:
    def reaches(source: str, target: str) -> bool:
        return any(_in(a, source) and _in(b, target) for a, b in edges(graph))

    assert not (reaches("app.media", "app.provenance") and reaches("app.provenance", "app.media"))


def test_no_import_cycles(graph: Graph) -> None:
    assert cycles(graph) == []


def test_a_cycle_is_found_when_there_is_one() -> None:
    graph: Graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_live_core_sits_below_its_transports(graph: Graph) -> None:
    """Sessions (`app.media.webrtc`) and streams (`app.server.streams`) adapt to the live core; it knows
    neither, nor any transport."""
    upward = sorted(
        (a, b)
        for a, b in edges(graph)
        if _in(a, "app.live") and any(_in(b, transport) for transport in ("app.media", "app.egress", "app.server"))
    )
    assert upward == []


def test_the_egress_sits_below_the_server(graph: Graph) -> None:
    """The outputs (`app.egress`) read the live core and the media utilities; the server wires them, never the
    reverse, and they know nothing of how frames came in (`app.media.webrtc`, `app.media.rtsp_in`)."""
    upward = sorted(
        (a, b)
        for a, b in edges(graph)
        if _in(a, "app.egress") and any(_in(b, m) for m in ("app.server", "app.media.webrtc", "app.media.rtsp_in"))
    )
    assert upward == []


MODULE_MAX_LINES = 600


def test_no_module_is_over_600_lines() -> None:
    """A module that grows past this has taken on a second job: split it by job."""
    long = {
        str(path.relative_to(ROOT)): n
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MODULE_MAX_LINES
    }
    assert long == {}


def package_graph(graph: Graph) -> Graph:
    """The same edges between the packages of `app/` (`app.media`, `app.live`, ...) and `engines`."""

    def package(module: str) -> str:
        if module == "app.cli":  # the console script and its sub-commands are one layer
            return "app.commands"
        parts = module.split(".")
        return ".".join(parts[:2]) if parts[0] == "app" and len(parts) > 1 else parts[0]

    packages: Graph = {}
    for source, target in edges(graph):
        a, b = package(source), package(target)
        packages.setdefault(a, set())
        packages.setdefault(b, set())
        if a != b:
            packages[a].add(b)
    return packages


def test_no_package_imports_another_that_imports_it_back(graph: Graph) -> None:
    packages = package_graph(graph)
    assert {"app.media", "app.egress", "app.live", "app.provenance"} <= set(packages)
    assert cycles(packages) == []
