"""Where the extension is, its pinned id, and a copy of it that a test may change."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EXTENSION = ROOT / "extension"


def manifest(directory: Path = EXTENSION) -> dict[str, Any]:
    return dict(json.loads((directory / "manifest.json").read_text(encoding="utf-8")))


def extension_id(directory: Path = EXTENSION) -> str:
    """Chrome's id of the extension: the first 128 bits of the SHA-256 of the manifest's public key, in a-p."""
    digest = hashlib.sha256(base64.b64decode(manifest(directory)["key"])).hexdigest()[:32]
    return "".join(chr(ord("a") + int(c, 16)) for c in digest)


def copy_with_host_permissions(target: Path, origins: list[str]) -> Path:
    """The extension with `origins` as host permissions it requires: what a user grants in Chrome's prompt at
    run time, granted at install instead (a headless browser shows no prompt to accept). Nothing else differs."""
    shutil.copytree(EXTENSION, target)
    changed = manifest(target)
    changed["host_permissions"] = origins
    (target / "manifest.json").write_text(json.dumps(changed, indent=2), encoding="utf-8")
    return target
