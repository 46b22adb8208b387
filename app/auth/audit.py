"""The audit log: one JSON object per line per security-relevant event, to stdout or appended to a file.

Events carry the principal and, for keys, the key id, never a key or token."""

import json
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

# What records an audit event (a name and its fields): a server's `AuditLog.event`, or `no_audit`.
Audit = Callable[..., None]


def no_audit(event: str, **fields: Any) -> None:
    """Records nothing: the audit of parts made without an audit log (tests, benchmarks)."""


class AuditLog:
    def __init__(self, target: str | None) -> None:
        """`target`: "stdout", a file path (appended to), or None to log nothing."""
        self._lock = threading.Lock()
        self._stream: IO[str] | None = None
        self._owned = False
        if target == "stdout":
            self._stream = sys.stdout
        elif target:
            path = Path(target)
            path.parent.mkdir(parents=True, exist_ok=True)
            self._stream = path.open("a", encoding="utf-8", buffering=1)
            self._owned = True

    @property
    def enabled(self) -> bool:
        return self._stream is not None

    def event(self, event: str, **fields: Any) -> None:
        stream = self._stream
        if stream is None:
            return
        record = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"), "event": event, **fields}
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._lock:
            stream.write(line + "\n")
            stream.flush()

    def close(self) -> None:
        with self._lock:
            stream, self._stream = self._stream, None
            if stream is not None and self._owned:
                stream.close()
