"""The rule for files that hold credentials or what they are checked against (the keys file, the channel
store): nobody else may write them, and they belong to the server's own user."""

import os
import stat
from pathlib import Path


def private_file_problem(path: Path, what: str) -> str | None:
    """Why `path` (called `what` in the message) must be refused, or None; a missing file has no problem."""
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (
            f"refusing {what} {path}: other users can write it (mode {stat.S_IMODE(info.st_mode):o}); "
            f"run `chmod 600 {path}`"
        )
    if info.st_uid != os.geteuid():
        return f"refusing {what} {path}: it belongs to user id {info.st_uid}, not to this server's ({os.geteuid()})"
    return None
