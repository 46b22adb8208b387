"""Files and directories appear whole or not at all, and stay whole across a power loss.

Everything is written under a temporary name in the destination's folder and renamed into place only when
the writer finished without error. A rename alone is not enough on a journaling file system: after a
power loss the new name can point at a file whose data never reached the disk (an empty model). So the
data is flushed (fsync) before the rename, and the folder after it, so that the new name itself survives.

Every file renamed into place here gets the mode a new file gets (0o666 less the umask, 0o644 usually),
whatever the writer created it with: `tempfile.mkstemp` would leave 0o600, readable by the owner only.

This is the one module that renames files (tests/test_architecture.py enforces it).
"""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

_UMASK_LINE = re.compile(r"^Umask:\s*([0-7]+)$", re.MULTILINE)


def new_file_mode() -> int:
    """The permission bits `open()` gives a new file: 0o666 less the process umask."""
    return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux tells the umask without changing it
        found = _UMASK_LINE.search(Path("/proc/self/status").read_text())
    except OSError:
        found = None
    if found:
        return int(found.group(1), 8)
    current = os.umask(0o022)  # elsewhere reading it means setting it; put it straight back
    os.umask(current)
    return current


def fsync_file(path: Path) -> None:
    """Flush a file's data and metadata to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (names created, renamed or removed in it) to the disk."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(path, flags)
    except (IsADirectoryError, PermissionError):  # platforms that cannot open a folder: nothing to flush
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems (and platforms) do not sync folders; the rename stands anyway
        pass
    finally:
        os.close(fd)


def _temporary_name(dst: Path, suffix: str) -> Path:
    return dst.parent / f".{dst.name}.{secrets.token_hex(4)}{suffix}"


@contextmanager
def atomic_path(dst: Path, suffix: str = ".tmp", mode: int | None = None) -> Iterator[Path]:
    """A new, empty temporary file beside `dst` to write to (and check) inside the block; flushed and
    renamed onto `dst` when the block ends normally, removed when it raises. `suffix` ends the temporary
    name, for writers that choose a format by it (numpy appends `.npz` to a name without it). `mode`
    (default: a new file's) is set before the rename, so a private file is never readable by others."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = _temporary_name(dst, suffix)
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666 if mode is None else mode))
            break
        except FileExistsError:
            continue
    try:
        yield tmp
        replace_file(tmp, dst, mode)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(dst: Path, data: bytes) -> Path:
    with atomic_path(dst) as tmp:
        tmp.write_bytes(data)
    return Path(dst)


def write_text_atomic(dst: Path, text: str) -> Path:
    return write_bytes_atomic(dst, text.encode("utf-8"))


def replace_file(src: Path, dst: Path, mode: int | None = None) -> Path:
    """Move a finished file (a completed download, a model made in a work folder) onto `dst`: its data is
    flushed, its mode made `mode` (default: that of a new file), the rename flushed. Both must be on one
    file system."""
    src, dst = Path(src), Path(dst)
    fsync_file(src)
    os.chmod(src, new_file_mode() if mode is None else mode)
    os.replace(src, dst)
    _fsync_parents(src, dst)
    return dst


def replace_dir(src: Path, dst: Path) -> Path:
    """Move a finished staging folder onto `dst` (absent, or an empty folder): every file and folder in it
    is flushed first, so the folder never appears with empty files after a power loss."""
    src, dst = Path(src), Path(dst)
    for folder, _, files in os.walk(src):
        for name in files:
            fsync_file(Path(folder) / name)
        fsync_dir(Path(folder))
    os.replace(src, dst)
    _fsync_parents(src, dst)
    return dst


def rename_durably(src: Path, dst: Path) -> Path:
    """Rename a file or folder whose contents need no flushing (moved aside before it is deleted); the
    rename itself is flushed."""
    src, dst = Path(src), Path(dst)
    os.replace(src, dst)
    _fsync_parents(src, dst)
    return dst


def _fsync_parents(src: Path, dst: Path) -> None:
    fsync_dir(dst.parent)
    if src.parent.resolve() != dst.parent.resolve():
        fsync_dir(src.parent)
