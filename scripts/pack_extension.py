"""Zips extension/ into dist/swapcast-extension-VERSION.zip, byte for byte the same on every run and machine:
files in sorted order, one fixed timestamp and mode, no directory entries. Checks the manifest first (JSON, MV3,
every file it names present) and, where Node.js is on PATH, every script's syntax (`node --check`).
Usage: python scripts/pack_extension.py [--out DIR]"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "extension"
FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: nothing of the build machine's clock


def named_files(manifest: dict[str, object]) -> list[str]:
    """The files the manifest refers to (the service worker, the options page)."""
    background = manifest.get("background")
    options = manifest.get("options_ui")
    names = []
    if isinstance(background, dict):
        names.append(str(background.get("service_worker")))
    if isinstance(options, dict):
        names.append(str(options.get("page")))
    return names


def check(source: Path) -> dict[str, object]:
    """The manifest, or SystemExit with the first thing wrong with it."""
    try:
        manifest = json.loads((source / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise SystemExit(f"pack-extension: {source / 'manifest.json'}: {error}") from None
    if manifest.get("manifest_version") != 3:
        raise SystemExit("pack-extension: manifest_version must be 3")
    missing = [name for name in named_files(manifest) if not (source / name).is_file()]
    if missing:
        raise SystemExit(f"pack-extension: the manifest names files that are not there: {', '.join(missing)}")
    return dict(manifest)


def check_scripts(source: Path) -> None:
    """SystemExit with Node's message for the first script that does not parse (skipped without Node)."""
    node = shutil.which("node")
    if node is None:
        print("pack-extension: node not found, scripts' syntax not checked", file=sys.stderr)
        return
    for script in sorted(source.glob("*.js")):
        result = subprocess.run([node, "--check", str(script)], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise SystemExit(f"pack-extension: {script.name} does not parse:\n{result.stderr.strip()}")


def pack(source: Path, out_dir: Path) -> Path:
    manifest = check(source)
    check_scripts(source)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"swapcast-extension-{manifest['version']}.zip"
    files = sorted(p for p in source.rglob("*") if p.is_file() and not p.name.startswith("."))
    with zipfile.ZipFile(target, "w") as archive:
        for path in files:
            info = zipfile.ZipInfo(path.relative_to(source).as_posix(), FIXED_TIME)
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, path.read_bytes(), compresslevel=9)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="where the zip goes (default: dist/)")
    args = parser.parse_args(argv)
    print(pack(SOURCE, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
