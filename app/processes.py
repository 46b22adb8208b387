"""Child processes: one started on a module of ours with its configuration on stdin (never on the command line,
where secrets would show in `ps`), and one ended with a grace period to finish on its own, then killed, and
always reaped."""

import contextlib
import json
import subprocess
import sys
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


def start_child(module: str, config: dict[str, Any]) -> subprocess.Popen[bytes]:
    """`python -m module` with pipes for stdin and stdout (stderr discarded: FFmpeg's messages may quote secrets),
    `config` written to its stdin as one JSON line. A child that is already gone does not fail this: its absence
    is seen on its stdout."""
    process = subprocess.Popen(
        [sys.executable, "-m", module], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    assert process.stdin is not None and process.stdout is not None
    with contextlib.suppress(OSError):
        process.stdin.write((json.dumps(config) + "\n").encode())
        process.stdin.flush()
    return process
