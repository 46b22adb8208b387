"""Which session, stream or file a mark was issued to: one JSON line per issue, appended when it is issued.

`swapcast watermark detect` looks a read payload up here; the same facts go to the audit log where one is kept.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from app.errors import UserError
from app.provenance.payload import MARK_BITS, Payload


@dataclass(frozen=True)
class MarkRecord:
    mark: str  # the payload as 12 hex digits
    server_id: int
    mark_id: int
    hour: int
    issued: str  # ISO 8601, UTC
    kind: str  # session, stream or file
    ref: str  # the session or stream id, or the file written
    identity: str | None = None
    owner: str | None = None

    def payload(self) -> Payload:
        return Payload(self.server_id, self.mark_id, self.hour)


class MarkRegistry:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def issue(
        self, *, server_id: int, kind: str, ref: str, identity: str | None = None, owner: str | None = None
    ) -> MarkRecord:
        """Draw a fresh mark id, record who it was issued to, and return the record."""
        now = time.time()
        payload = Payload.at(server_id, secrets.randbelow(1 << MARK_BITS), now)
        record = MarkRecord(
            mark=payload.hex(),
            server_id=payload.server_id,
            mark_id=payload.mark_id,
            hour=payload.hour,
            issued=datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
            kind=kind,
            ref=ref,
            identity=identity,
            owner=owner,
        )
        line = (json.dumps(asdict(record), sort_keys=True) + "\n").encode()
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # One write per line on an O_APPEND descriptor: lines of concurrent writers never interleave.
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line)
                os.fsync(fd)
            finally:
                os.close(fd)
        return record

    def lookup(self, payload: Payload) -> list[MarkRecord]:
        """Every record issued with this payload (usually one), newest first."""
        if not self.path.is_file():
            return []
        found: list[MarkRecord] = []
        try:
            lines = self.path.read_text().splitlines()
        except OSError as exc:
            raise UserError(f"cannot read the mark registry {self.path}: {exc.strerror}") from None
        for line in lines:
            try:
                record = MarkRecord(**json.loads(line))
            except (ValueError, TypeError):
                continue  # a torn last line after a crash; the others stay readable
            if record.payload() == payload:
                found.append(record)
        return found[::-1]
