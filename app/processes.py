"""Ending a child process: it gets a grace period to finish on its own, then it is killed, and always reaped."""

import subprocess
from typing import Any

KILL_WAIT_S = 5.0


def wait_or_kill(process: subprocess.Popen[Any], grace_s: float) -> None:
    """Wait up to `grace_s` for `process` to end (the caller has asked it to: a signal, or its input closed), then
    kill it; either way it is reaped, so no zombie is left."""
    try:
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(KILL_WAIT_S)
