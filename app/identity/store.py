"""Identities on disk, so they survive restarts.

Each identity is a directory named by its id holding its photos (PNGs of their decoded pixels, never the uploaded
bytes; identities stored before that keep their upload; `image.png`, then `image-2.png`... for an identity
enrolled from several), `meta.json`, a small
`thumb.jpg` of the chosen face and, under `prepared/`, one `.npy` per swap model it was prepared for (keyed by
the engine's model_key). A directory appears only once complete (written aside, flushed to disk, then renamed
into place), and deleting one removes all of it: moved aside in one rename, then removed.
`meta.json` carries the uploader's consent statement (`app.identity.consent`); identities stored before consent
was recorded have none.
`load_prepared` is the loader for `IdentityCache`: it reads the stored preparation for a model, or prepares the
stored photo again when the model changed.
"""

import errno
import hashlib
import io
import json
import logging
import re
import secrets
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from app.errors import UserError
from app.identity.consent import Consent
from app.identity.images import FORMATS, ImageRejected, decode_image
from app.identity.quota import Usage
from app.identity.record import Identity
from app.identity.validate import DamagedIdentity, PreparedSpec, check_directory, check_prepared, read_identity
from app.pipeline.swap import PreparedSource
from app.pipeline.types import Image
from engines.atomic import atomic_path, rename_durably, replace_dir

log = logging.getLogger(__name__)

ID_PATTERN = re.compile(r"^[0-9a-f]{32}$")
_META = "meta.json"
_THUMB = "thumb.jpg"
_PREPARED = "prepared"
# Stored photos passed the upload limit already; this only bounds a file changed on disk behind our back.
_STORED_MAX_PIXELS = 400_000_000

# Prepares an identity from its photos (the first one first) and its face_index.
Prepare = Callable[[list[Image], int | None], PreparedSource]


class IdentityNotFound(LookupError):
    def __init__(self, identity_id: str) -> None:
        super().__init__(f"identity {identity_id} not found")
        self.identity_id = identity_id


class IdentityUnreadable(Exception):
    """An identity's files exist but cannot be used (damaged on disk, or no longer preparable)."""


class StoreFull(OSError):
    """The store's disk (or the owner's disk quota, or the file size limit) has no room: nothing was stored."""

    def __init__(self) -> None:
        super().__init__("the identity store's disk is full: no identity was stored")


# What a write that ran out of room raises: the disk is full, a disk quota or the file size limit is reached.
_NO_ROOM = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


def is_identity_id(value: str) -> bool:
    return bool(ID_PATTERN.fullmatch(value))  # `$` alone would let a final newline through


def prepared_file_name(model_key: str) -> str:
    """A file name for a model key: readable, and unique through a short hash of the exact key."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", model_key)[:80]
    digest = hashlib.sha256(model_key.encode()).hexdigest()[:12]
    return f"{safe}-{digest}.npy"


class IdentityStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()

    def open(self) -> None:
        """Create the directory and remove what interrupted writes and deletes left behind."""
        self.root.mkdir(parents=True, exist_ok=True)
        for leftover in self.root.glob(".tmp-*"):
            shutil.rmtree(leftover, ignore_errors=True)
        for leftover in self.root.glob(".trash-*"):
            shutil.rmtree(leftover, ignore_errors=True)

    def _dir(self, identity_id: str) -> Path:
        if not is_identity_id(identity_id):
            raise IdentityNotFound(identity_id)
        return self.root / identity_id

    def create(
        self,
        *,
        name: str,
        photo: bytes,
        format: str,
        width: int,
        height: int,
        faces: int,
        face_index: int | None,
        thumbnail: bytes,
        prepared: PreparedSource,
        owner: str | None = None,
        consent: Consent | None = None,
        extra_photos: Sequence[bytes] = (),
    ) -> Identity:
        """Store a new identity; `photo` is its first photo, `extra_photos` the others it was enrolled from."""
        if format not in FORMATS:
            raise ValueError(f"unknown image format {format!r}")
        identity = Identity(
            id=secrets.token_hex(16),
            name=name,
            created=datetime.now(UTC).isoformat(timespec="seconds"),
            faces=faces,
            face_index=face_index,
            format=format,
            width=width,
            height=height,
            owner=owner,
            consent=consent,
            photos=1 + len(extra_photos),
        )
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            staging = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.root))
        except OSError as exc:
            if exc.errno in _NO_ROOM:
                raise StoreFull() from exc
            raise
        try:
            for name, data in zip(identity.image_files, (photo, *extra_photos), strict=True):
                (staging / name).write_bytes(data)
            (staging / _THUMB).write_bytes(thumbnail)
            (staging / _PREPARED).mkdir()
            _save_array(staging / _PREPARED / prepared_file_name(prepared.model_key), prepared.data)
            meta = {**asdict(identity), "consent": identity.consent.to_json() if identity.consent else None}
            (staging / _META).write_text(json.dumps(meta, indent=1), encoding="utf-8")
            replace_dir(staging, self.root / identity.id)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, OSError) and exc.errno in _NO_ROOM:
                raise StoreFull() from exc
            raise
        return identity

    def get(self, identity_id: str) -> Identity:
        directory = self._dir(identity_id)
        if not (directory / _META).exists():
            raise IdentityNotFound(identity_id)
        try:
            return read_identity(directory)
        except DamagedIdentity as exc:
            raise IdentityUnreadable(f"identity {identity_id} is damaged: {exc}") from None

    def list(self) -> list[Identity]:
        """Readable identities, oldest first."""
        found = []
        if not self.root.is_dir():
            return []
        for entry in self.root.iterdir():
            if not is_identity_id(entry.name):
                continue
            try:
                found.append(self.get(entry.name))
            except (IdentityNotFound, IdentityUnreadable):
                continue
        return sorted(found, key=lambda i: (i.created, i.id))

    def exists(self, identity_id: str) -> bool:
        return is_identity_id(identity_id) and (self.root / identity_id / _META).is_file()

    def delete(self, identity_id: str) -> None:
        """Remove the identity's photo, thumbnail, metadata and every preparation. Under the lock, so a
        preparation being saved lands either before the move (and goes with it) or finds no directory."""
        directory = self._dir(identity_id)
        trash = self.root / f".trash-{identity_id}-{secrets.token_hex(4)}"
        with self._lock:
            try:
                rename_durably(directory, trash)
            except FileNotFoundError:
                raise IdentityNotFound(identity_id) from None
        shutil.rmtree(trash, ignore_errors=True)
        if trash.exists():  # gone from the API already; the next `open` sweeps what is left
            log.warning("identity %s: some files could not be removed yet (%s)", identity_id, trash)

    def photo(self, identity_id: str) -> bytes:
        identity = self.get(identity_id)
        try:
            return (self._dir(identity_id) / identity.image_file).read_bytes()
        except FileNotFoundError:
            raise IdentityNotFound(identity_id) from None

    def thumbnail(self, identity_id: str) -> bytes:
        self.get(identity_id)
        try:
            return (self._dir(identity_id) / _THUMB).read_bytes()
        except FileNotFoundError:
            raise IdentityUnreadable(f"identity {identity_id} is damaged: the thumbnail is missing") from None

    def usage(self, owner: str | None = None) -> Usage:
        """Identities stored and their bytes on disk: all of them, or those `owner` created (one whose metadata
        cannot be read counts for nobody: its owner is unknown, and admin can delete it)."""
        count = size = 0
        if self.root.is_dir():
            for entry in self.root.iterdir():
                if not is_identity_id(entry.name) or not entry.is_dir():
                    continue
                if owner is not None and self._owner_of(entry) != owner:
                    continue
                count += 1
                size += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        return Usage(count, size)

    @staticmethod
    def _owner_of(directory: Path) -> str | None:
        try:
            return read_identity(directory).owner
        except DamagedIdentity:
            return None

    def audit(self, spec: PreparedSpec | None = None, model_key: str | None = None) -> dict[str, str]:
        """Every damaged identity with the reason; `spec` checks the prepared data for `model_key` too."""
        damaged: dict[str, str] = {}
        if not self.root.is_dir():
            return damaged
        key_file = prepared_file_name(model_key) if model_key is not None else None
        for entry in sorted(self.root.iterdir()):
            if not is_identity_id(entry.name) or not entry.is_dir():
                continue
            try:
                check_directory(entry, spec, key_file)
            except DamagedIdentity as exc:
                damaged[entry.name] = str(exc)
        return damaged

    def load_prepared(
        self, identity_id: str, model_key: str, engine: str, prepare: Prepare, spec: PreparedSpec | None = None
    ) -> PreparedSource:
        """The identity prepared for `model_key`: from disk when it was prepared for that model before (checked
        against `spec`: shape, dtype, finite), else prepared now from the stored photo (and saved for next time)."""
        identity = self.get(identity_id)
        directory = self._dir(identity_id)
        path = directory / _PREPARED / prepared_file_name(model_key)
        try:
            data = np.load(path, allow_pickle=False)
            check_prepared(data, spec)
            return PreparedSource(engine, model_key, data)
        except FileNotFoundError:
            pass
        except DamagedIdentity as exc:
            raise IdentityUnreadable(f"identity {identity_id} is damaged: {exc}") from None
        except (OSError, ValueError, EOFError):
            raise IdentityUnreadable(f"identity {identity_id} is damaged: its prepared data is not readable") from None
        try:
            photos = [(directory / name).read_bytes() for name in identity.image_files]
        except FileNotFoundError:
            raise IdentityNotFound(identity_id) from None
        try:
            images = [decode_image(photo, _STORED_MAX_PIXELS)[0] for photo in photos]
            prepared = prepare(images, identity.face_index)
        except (ImageRejected, UserError) as exc:
            reason = f"cannot prepare the stored photos again ({exc})"
            raise IdentityUnreadable(f"identity {identity_id}: {reason}") from None
        if prepared.model_key != model_key:
            raise IdentityUnreadable(
                f"identity {identity_id}: prepared for {prepared.model_key}, but {model_key} was asked for"
            )
        with self._lock:
            if directory.is_dir():
                (directory / _PREPARED).mkdir(exist_ok=True)
                _save_array(path, prepared.data)
        return prepared


def _save_array(path: Path, data: np.ndarray) -> None:
    # Serialised first and written in one call: numpy writing to a file that runs out of room raises an
    # OSError without an errno, a plain write says ENOSPC.
    buffer = io.BytesIO()
    np.save(buffer, np.ascontiguousarray(data), allow_pickle=False)
    with atomic_path(path) as tmp:
        tmp.write_bytes(buffer.getvalue())
