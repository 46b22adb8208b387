"""Pushes on disk: `pushes.json` beside the channel records, each push's channel, owner and destination with its
secrets (stream key, Bearer token, SRT passphrase). Those must be sent as they are, so they are kept as they
are, under the channel store's rules: mode 600, refused when other users can write the file or it belongs to
another user. The API and the logs show destinations only with the secrets hidden.

Each push keeps the credential that added it (a key id, `jwt:SUB` or `local`), as live sessions do: revoking
that key ends and forgets the push. Records written before credentials were kept have none (`credential` is
None): the server decides at start-up whether such a push may run (`app.server.pushes`).
"""

from __future__ import annotations

import fcntl
import json
import secrets
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from app.auth.private_file import private_file_problem
from app.channels.store import ChannelStoreError
from app.egress.push_destination import Destination, DestinationInvalid
from engines.atomic import atomic_path

PUSHES = "pushes.json"
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class PushRecord:
    id: str
    channel: str
    owner: str
    created: str
    destination: Destination
    credential: str | None = None  # what added it; None in records from before credentials were kept

    def public(self) -> dict[str, Any]:
        return {"id": self.id, "channel": self.channel, "created": self.created, **self.destination.describe()}

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "destination": self.destination.to_json()}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PushRecord:
        destination = Destination.from_json(raw["destination"])
        credential = raw.get("credential")
        if credential is not None and not isinstance(credential, str):
            raise TypeError("credential")
        return cls(raw["id"], raw["channel"], raw["owner"], raw["created"], destination, credential)


class PushStore:
    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / PUSHES
        self._lock = threading.Lock()

    def records(self, channel: str | None = None) -> list[PushRecord]:
        with self._lock:
            found = self._read()
        return [r for r in found if channel is None or r.channel == channel]

    def add(self, channel: str, owner: str, destination: Destination, credential: str) -> PushRecord:
        record = PushRecord(
            id=f"p{secrets.token_hex(6)}",
            channel=channel,
            owner=owner,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            destination=destination,
            credential=credential,
        )
        with self._writing() as records:
            records.append(record)
        return record

    def remove(self, push_id: str) -> PushRecord | None:
        with self._writing() as records:
            found = next((r for r in records if r.id == push_id), None)
            if found is not None:
                records.remove(found)
        return found

    def update(self, record: PushRecord) -> bool:
        """`record` in place of the stored one of its id; False when that one is gone."""
        with self._writing() as records:
            index = next((i for i, r in enumerate(records) if r.id == record.id), None)
            if index is not None:
                records[index] = record
        return index is not None

    def remove_where(self, gone: Callable[[PushRecord], bool]) -> list[PushRecord]:
        """Remove every record `gone` is true of; returns them."""
        with self._writing() as records:
            removed = [r for r in records if gone(r)]
            records[:] = [r for r in records if not gone(r)]
        return removed

    def remove_channel(self, channel: str) -> list[PushRecord]:
        with self._writing() as records:
            gone = [r for r in records if r.channel == channel]
            records[:] = [r for r in records if r.channel != channel]
        return gone

    def _read(self) -> list[PushRecord]:
        if not self.path.exists():
            return []
        problem = private_file_problem(self.path, "the push store's file")
        if problem is not None:
            raise ChannelStoreError(problem)
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return [PushRecord.from_json(item) for item in raw["pushes"]]
        except (OSError, ValueError, KeyError, TypeError, DestinationInvalid) as exc:
            raise ChannelStoreError(f"cannot read the push store {self.path}: {type(exc).__name__}") from None

    @contextmanager
    def _writing(self) -> Iterator[list[PushRecord]]:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with (self.directory / f".{PUSHES}.lock").open("a") as lock, self._lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            records = self._read()
            yield records
            body = {"version": _FORMAT_VERSION, "pushes": [r.to_json() for r in records]}
            with atomic_path(self.path, mode=0o600) as tmp:
                tmp.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
