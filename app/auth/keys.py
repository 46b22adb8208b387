"""API keys: `sk_<id>_<secret>`, shown once when created; the keys file keeps only the id, a random salt and
the SHA-256 of salt + secret (`app.auth.bearer_secret`).

The server re-reads the file when its modification time changes, so `swapcast keys create|revoke` take effect on
a running server without a restart. A file that another local user could change (group- or world-writable, or
owned by someone else) is refused outright: whoever can write it can add an admin key.
"""

import fcntl
import json
import re
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from app.auth.bearer_secret import StoredSecret, credential_pattern, matches, new_secret, split
from app.auth.private_file import private_file_problem
from engines.atomic import atomic_path

PREFIX = "sk_"
KEY_PATTERN = credential_pattern(PREFIX, 12)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$")
_FORMAT_VERSION = 1


class KeyStoreError(Exception):
    """The keys file cannot be read or a key cannot be created or revoked; the message says why."""


@dataclass(frozen=True)
class KeyRecord:
    id: str
    name: str
    scopes: tuple[str, ...]
    salt: str
    hash: str
    created: str
    revoked: str | None = None

    @property
    def active(self) -> bool:
        return self.revoked is None


def key_id_of(token: str) -> str | None:
    """The id part of something shaped like a key (for logs); None when it is not one."""
    match = KEY_PATTERN.fullmatch(token)
    return match.group(1) if match else None


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class KeyStore:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._records: dict[str, KeyRecord] = {}
        self._stamp: tuple[int, ...] | None = None

    # ------------------------------------------------------------------------------ reading

    def records(self) -> list[KeyRecord]:
        self.refresh()
        return sorted(self._records.values(), key=lambda r: (r.created, r.id))

    def has_active(self) -> bool:
        self.refresh()
        return any(r.active for r in self._records.values())

    def revoked_ids(self) -> set[str]:
        self.refresh()
        return {r.id for r in self._records.values() if not r.active}

    def active_ids(self) -> set[str]:
        self.refresh()
        return {r.id for r in self._records.values() if r.active}

    def exists(self) -> bool:
        """Whether there is a keys file at all (once there is, the server never falls back to local mode)."""
        return self.path.exists()

    def verify(self, token: str) -> KeyRecord | None:
        """The active record this key belongs to, or None. Constant time in the secret."""
        self.refresh()
        key_id, secret = split(KEY_PATTERN, token)
        record = self._records.get(key_id)
        stored = StoredSecret(record.salt, record.hash) if record else None
        if not matches(secret, stored) or record is None or not record.active:
            return None
        return record

    def refresh(self) -> None:
        """Re-read the file if it changed since the last read (a missing file holds no keys)."""
        try:
            info = self.path.stat()
            # Mode and owner too: a chmod changes neither the modification time nor the size.
            stamp: tuple[int, ...] | None = (info.st_mtime_ns, info.st_size, info.st_mode, info.st_uid)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if stamp == self._stamp and (stamp is not None or not self._records):
                return
            if stamp is not None:
                self._check_permissions()
            self._records = self._read() if stamp is not None else {}
            self._stamp = stamp

    def _check_permissions(self) -> None:
        problem = private_file_problem(self.path, "the keys file")
        if problem is not None:
            raise KeyStoreError(problem)

    def _read(self) -> dict[str, KeyRecord]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            records = [KeyRecord(**{**item, "scopes": tuple(item["scopes"])}) for item in raw["keys"]]
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise KeyStoreError(f"cannot read the keys file {self.path}: {exc}") from None
        return {r.id: r for r in records}

    # ------------------------------------------------------------------------------ writing (the CLI)

    @contextmanager
    def _writing(self) -> Iterator[dict[str, KeyRecord]]:
        """The records to change, written back when the block ends; one writer at a time across processes."""
        directory = self.path.parent
        if not directory.exists():
            directory.mkdir(parents=True, mode=0o700)
        with (directory / f".{self.path.name}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._stamp = None
            records = {r.id: r for r in self.records()}
            yield records
            self._write(records)

    def create(self, name: str, scopes: list[str]) -> tuple[KeyRecord, str]:
        """A new key for `name` with `scopes`; returns its record and the key, which is not stored."""
        if not NAME_PATTERN.fullmatch(name):  # `$` alone would let a final newline through
            raise KeyStoreError(f"invalid key name {name!r}: use letters, digits and . _ @ - (at most 64)")
        if not scopes:
            raise KeyStoreError("give the key at least one --scope")
        key_id = secrets.token_hex(6)
        secret, stored = new_secret()
        record = KeyRecord(
            id=key_id,
            name=name,
            scopes=tuple(dict.fromkeys(scopes)),
            salt=stored.salt,
            hash=stored.hash,
            created=_now(),
        )
        with self._writing() as records:
            if key_id in records:  # 48 random bits: practically never; refuse rather than overwrite
                raise KeyStoreError("key id collision; run the command again")
            records[key_id] = record
        return record, f"{PREFIX}{key_id}_{secret}"

    def revoke(self, key_id_or_name: str) -> list[KeyRecord]:
        """Revoke the key with this id, or every active key with this name; returns what was revoked."""
        with self._writing() as records:
            chosen = [r for r in records.values() if r.active and key_id_or_name in (r.id, r.name)]
            if not chosen:
                raise KeyStoreError(f"no active key with id or name {key_id_or_name!r} (see `swapcast keys list`)")
            now = _now()
            for record in chosen:
                records[record.id] = replace(record, revoked=now)
        return [records[r.id] for r in chosen]

    def _write(self, records: dict[str, KeyRecord]) -> None:
        body = {"version": _FORMAT_VERSION, "keys": [asdict(r) | {"scopes": list(r.scopes)} for r in records.values()]}
        # Only salted hashes of 256-bit secrets are inside, but nobody else needs to read them: private from
        # the moment the file exists under its name.
        with atomic_path(self.path, mode=0o600) as tmp:
            tmp.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
        self._stamp = None
        self.refresh()
