"""Files appear whole or not at all: written to a temporary name in the destination's folder, renamed
into place only when the writer finished without error."""

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_path(dst: Path, suffix: str = ".tmp") -> Iterator[Path]:
    """A temporary path beside `dst` to write to (and check) inside the block; renamed onto `dst` when the
    block ends normally, removed when it raises. The file is readable by others (0644), like a plain write."""
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=suffix, dir=dst.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        os.chmod(tmp, 0o644)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)


def write_bytes_atomic(dst: Path, data: bytes) -> Path:
    with atomic_path(dst) as tmp:
        tmp.write_bytes(data)
    return Path(dst)
