"""The secret half of a bearer credential shaped `<prefix><id>_<secret>` (API keys, viewer tokens): made from
32 random bytes, stored as a random salt and the SHA-256 of salt + secret, checked in constant time.

256 random bits need no slow password hash: a stolen store cannot be brute-forced back to a secret. The id
finds the record without trying every hash and is the only part that ever reaches a log."""

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass

SECRET_BYTES = 32
SECRET_CHARS = 43  # token_urlsafe(32)
# Compared against when the id is unknown, so a miss costs the same hash and compare as a hit.
_DUMMY_SALT = bytes(16)
_DUMMY_SECRET = "x" * SECRET_CHARS


@dataclass(frozen=True)
class StoredSecret:
    salt: str  # hex
    hash: str  # hex SHA-256 of salt + secret


def credential_pattern(prefix: str, id_hex_chars: int) -> re.Pattern[str]:
    """`prefix`, an id of `id_hex_chars` hex digits, `_`, the secret: the groups are the id and the secret."""
    return re.compile(rf"^{re.escape(prefix)}([0-9a-f]{{{id_hex_chars}}})_([A-Za-z0-9_-]{{{SECRET_CHARS}}})$")


def _digest(salt: bytes, secret: str) -> str:
    return hashlib.sha256(salt + secret.encode("ascii")).hexdigest()


_DUMMY_HASH = _digest(_DUMMY_SALT, _DUMMY_SECRET)


def new_secret() -> tuple[str, StoredSecret]:
    """A fresh secret (to show once) and what to store of it."""
    secret = secrets.token_urlsafe(SECRET_BYTES)
    salt = secrets.token_bytes(16)
    return secret, StoredSecret(salt.hex(), _digest(salt, secret))


def split(pattern: re.Pattern[str], credential: str) -> tuple[str, str]:
    """(id, secret) of a credential; a malformed one gives an id no record has, so it fails like a wrong one."""
    match = pattern.fullmatch(credential)  # `$` alone would let a final newline through
    return (match.group(1), match.group(2)) if match else ("", _DUMMY_SECRET)


def matches(secret: str, stored: StoredSecret | None) -> bool:
    """Whether `secret` is the one stored; with nothing stored, the same work and False."""
    salt = bytes.fromhex(stored.salt) if stored else _DUMMY_SALT
    same = hmac.compare_digest(_digest(salt, secret), stored.hash if stored else _DUMMY_HASH)
    return stored is not None and same
