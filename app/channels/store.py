"""Channels on disk: `channels.json` (the records) and `secret` (what RTSP passwords are derived from), in one
directory that replicas may share.

A record holds the channel's name, owner, picture size and rate, the generation of its RTSP login, two random
parts and its viewer token's salted hash. RTSP logins are checked by the RTSP server with Digest
authentication, which needs the password itself, so no password is stored: each is derived, HMAC-SHA256 under
a 256-bit secret kept beside the records. The random parts make what is derived unknowable in advance:
`nonce` is drawn when the record is made (a deleted and re-created name is another channel, with another
password; the user name stays the name's, as the RTSP server grants a path to one user), `salt` is drawn again
by every rotation (a rotation's password cannot be computed from earlier ones, whoever saw them). Both are in
the record, so every replica sharing the directory derives the same login. Records from before the random
parts are given theirs when read (and written back at once): their credentials change once, rather than
staying a function of the name. Both files follow the keys file's rules (mode 600, refused when other users
can write them or they belong to another user); rotating a channel's credentials moves its generation on,
draws a new salt (a new password) and replaces its viewer token.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import hmac
import json
import re
import secrets
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

from app.auth.private_file import private_file_problem
from app.auth.viewer_tokens import ViewerToken, new_viewer_token
from engines.atomic import atomic_path

NAME_PATTERN = re.compile(r"[a-z0-9][a-z0-9_-]{0,62}")  # whole names only: `fullmatch`
RECORDS = "channels.json"
SECRET = "secret"
_FORMAT_VERSION = 1


class ChannelStoreError(Exception):
    """The channel store cannot be used (unsafe or damaged files); the message says why."""


class ChannelExists(Exception):
    pass


class ChannelNameInvalid(ValueError):
    pass


def check_name(name: str) -> str:
    if not NAME_PATTERN.fullmatch(name):
        raise ChannelNameInvalid(
            f"invalid channel name {name!r}: use 1-63 lowercase letters, digits, - and _, starting with a letter "
            "or digit (it goes into URLs as it is)"
        )
    return name


@dataclass(frozen=True)
class ChannelRecord:
    name: str
    owner: str
    created: str
    width: int
    height: int
    fps: int
    generation: int  # of the RTSP login: rotating moves it on
    token: ViewerToken  # the channel's viewer token (salted hash only)
    nonce: str  # random, drawn when the record is made: "" in a record from before random parts
    salt: str  # random, drawn again by every rotation

    @property
    def legacy(self) -> bool:
        """Written before records had random parts: its login must not be derived until it has them."""
        return not (self.nonce and self.salt)

    @property
    def key(self) -> str:  # as outputs are keyed: viewer tokens, WHEP viewers
        return f"channel/{self.name}"

    def public(self) -> dict[str, object]:
        return {
            "name": self.name,
            "created": self.created,
            "width": self.width,
            "height": self.height,
            "fps": self.fps,
            "viewer_token_id": self.token.id,
        }

    def to_json(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: dict[str, object]) -> ChannelRecord:
        token = raw["token"]
        if not isinstance(token, dict):
            raise TypeError("token is not an object")
        fields = {"nonce": "", "salt": "", **raw, "token": ViewerToken(**token)}
        return cls(**fields)  # type: ignore[arg-type]


class ChannelStore:
    """The records, re-read when the file changes (another replica, or a restart, wrote it)."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self.path = self.directory / RECORDS
        self._lock = threading.Lock()
        self._records: dict[str, ChannelRecord] = {}
        self._stamp: tuple[int, ...] | None = None
        self._secret: bytes | None = None

    # ------------------------------------------------------------------------------ reading

    def open(self) -> None:
        """Make the directory and the secret if they are missing; read the records. `ChannelStoreError` when the
        files are unsafe or damaged."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        secret_path = self.directory / SECRET
        if not secret_path.exists():
            with self._writing():  # one process makes it
                if not secret_path.exists():
                    with atomic_path(secret_path, mode=0o600) as tmp:
                        tmp.write_bytes(secrets.token_bytes(32))
        _check_private(secret_path)
        secret = secret_path.read_bytes()
        if len(secret) < 32:
            raise ChannelStoreError(f"the channel secret {secret_path} is damaged (shorter than 32 bytes)")
        self._secret = secret
        self.refresh()

    def refresh(self) -> None:
        if self._load() and self._secret is not None:
            try:
                with self._writing():  # gives records from before random parts theirs (one replica does)
                    pass
            except OSError as exc:
                raise ChannelStoreError(f"cannot give the channel store's records their random parts: {exc}") from None
            self._load()

    def _load(self) -> bool:
        """Read the records if the file changed; True when one of them has no random parts yet."""
        try:
            info = self.path.stat()
            stamp: tuple[int, ...] | None = (info.st_mtime_ns, info.st_size, info.st_mode, info.st_uid, info.st_ino)
        except FileNotFoundError:
            stamp = None
        with self._lock:
            if stamp != self._stamp:
                if stamp is not None:
                    _check_private(self.path)
                self._records = self._read() if stamp is not None else {}
                self._stamp = stamp
            return any(r.legacy for r in self._records.values())

    def records(self) -> list[ChannelRecord]:
        self.refresh()
        with self._lock:
            return sorted(self._records.values(), key=lambda r: r.name)

    def get(self, name: str) -> ChannelRecord | None:
        self.refresh()
        with self._lock:
            return self._records.get(name)

    def _read(self) -> dict[str, ChannelRecord]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            records = [ChannelRecord.from_json(item) for item in raw["channels"]]
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ChannelStoreError(f"cannot read the channel store {self.path}: {exc}") from None
        return {r.name: r for r in records}

    # ------------------------------------------------------------------------------ RTSP logins

    def rtsp_login(self, record: ChannelRecord) -> tuple[str, str]:
        """The user name (fixed for the channel) and password (of its generation) that may play its RTSP path."""
        if self._secret is None:
            raise ChannelStoreError("the channel store is not open")
        if record.legacy:  # never the old derivation, a function of the name and the rotation count alone
            raise ChannelStoreError(f"channel {record.name} has no random parts yet: read it from the store again")
        user = hmac.new(self._secret, f"user:{record.name}".encode(), hashlib.sha256).digest()  # not a secret
        material = f"password:{record.name}:{record.nonce}:{record.generation}:{record.salt}"
        password = hmac.new(self._secret, material.encode(), hashlib.sha256)
        return f"c{user[:6].hex()}", base64.urlsafe_b64encode(password.digest()[:18]).decode()

    # ------------------------------------------------------------------------------ writing

    @contextmanager
    def _writing(self) -> Iterator[dict[str, ChannelRecord]]:
        """The records to change, written back when the block ends; one writer at a time across processes. Records
        from before random parts get theirs here, under the lock, so that every replica derives the same login."""
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with (self.directory / f".{RECORDS}.lock").open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            self._stamp = None
            self._load()
            with self._lock:
                records = dict(self._records)
            before = dict(records)
            for name, record in before.items():
                if record.legacy:
                    records[name] = replace(record, nonce=_random_part(), salt=_random_part())
            yield records
            if records != before:
                self._write(records)

    def _write(self, records: dict[str, ChannelRecord]) -> None:
        body = {"version": _FORMAT_VERSION, "channels": [r.to_json() for r in records.values()]}
        with atomic_path(self.path, mode=0o600) as tmp:
            tmp.write_text(json.dumps(body, indent=1) + "\n", encoding="utf-8")
        self._stamp = None

    def create(self, name: str, owner: str, width: int, height: int, fps: int) -> tuple[ChannelRecord, str]:
        """A new channel; returns its record and its viewer token (shown once). `ChannelExists` when the name is
        taken (by anyone: names are unique per server)."""
        check_name(name)
        token, secret = new_viewer_token(f"channel/{name}", owner, "")
        record = ChannelRecord(
            name=name,
            owner=owner,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            width=width,
            height=height,
            fps=fps,
            generation=1,
            token=token,
            nonce=_random_part(),
            salt=_random_part(),
        )
        with self._writing() as records:
            if name in records:
                raise ChannelExists(f"channel {name} exists")
            records[name] = record
        return record, secret

    def rotate(self, name: str) -> tuple[ChannelRecord, str]:
        """A new RTSP password and viewer token for the channel; returns the record and the token."""
        with self._writing() as records:
            old = records.get(name)
            if old is None:
                raise KeyError(name)
            token, secret = new_viewer_token(old.key, old.owner, "")
            records[name] = record = replace(old, generation=old.generation + 1, salt=_random_part(), token=token)
        return record, secret

    def delete(self, name: str) -> ChannelRecord | None:
        with self._writing() as records:
            return records.pop(name, None)

    def count_owned(self, owner: str) -> int:
        return sum(1 for r in self.records() if r.owner == owner)


def _random_part() -> str:
    return secrets.token_hex(16)


def _check_private(path: Path) -> None:
    problem = private_file_problem(path, "the channel store's file")
    if problem is not None:
        raise ChannelStoreError(problem)
