"""Consent on identities: who the person in the photo is to the uploader, in the uploader's own words.

An upload states `self` (the photo shows the uploader) or `obtained` (it shows someone who agreed, with the
uploader's attestation of how). The identity's metadata records the statement with the uploaded photo's SHA-256,
the owner and the time, so the record names the exact photo it covers and who vouched for it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Literal, cast, get_args

Statement = Literal["self", "obtained"]
STATEMENTS: tuple[str, ...] = get_args(Statement)
MAX_ATTESTATION = 1000  # characters; at most 4,000 bytes of UTF-8, inside the form's 4,096-byte part limit

# Control characters other than tab and newline: an attestation is shown and logged, so it stays plain text.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]+")


class ConsentInvalid(ValueError):
    """The upload's consent statement is missing or not acceptable; the message says why."""


@dataclass(frozen=True)
class ConsentStatement:
    """What the uploader states: checked, not yet tied to a photo."""

    statement: Statement
    attestation: str | None

    @classmethod
    def parse(cls, consent: str | None, attestation: str | None) -> ConsentStatement:
        """The form's `consent` and `attestation` fields, checked; ConsentInvalid with the reason otherwise."""
        given = consent or ""
        choice = given.strip().lower()
        if not choice:
            raise ConsentInvalid(
                "consent is required: send `consent=self` (the photo shows you) or `consent=obtained` with an "
                "`attestation` saying who the person is and how they agreed"
            )
        if choice not in STATEMENTS:
            raise ConsentInvalid(f"consent must be `self` or `obtained`, got {given[:20]!r}")
        text = _CONTROL.sub(" ", attestation or "").strip() or None
        if text is not None and len(text) > MAX_ATTESTATION:
            raise ConsentInvalid(f"attestation is longer than {MAX_ATTESTATION} characters")
        if choice == "obtained" and text is None:
            raise ConsentInvalid(
                "consent=obtained needs an `attestation`: who the person in the photo is and how they agreed"
            )
        return cls(cast(Statement, choice), text)


@dataclass(frozen=True)
class Consent:
    """A consent statement as recorded with an identity."""

    statement: Statement
    attestation: str | None
    photo_sha256: str  # the (first) photo the statement covers, byte for byte as uploaded
    owner: str | None  # the principal that made the statement
    time: str  # ISO 8601, UTC
    # Every photo the statement covers, in upload order, when an identity is enrolled from several; empty when
    # it covers `photo_sha256` alone.
    photos_sha256: tuple[str, ...] = ()

    @classmethod
    def record(
        cls,
        given: ConsentStatement,
        *,
        upload: bytes,
        owner: str | None,
        time: str | None = None,
        more_uploads: Sequence[bytes] = (),
    ) -> Consent:
        """The statement tied to the photos as uploaded (the store keeps re-encoded copies without the files'
        metadata, so these hashes are the ones that match the uploader's own files), now unless `time` is given."""
        when = time or datetime.now(UTC).isoformat(timespec="seconds")
        hashes = tuple(hashlib.sha256(data).hexdigest() for data in (upload, *more_uploads))
        return cls(given.statement, given.attestation, hashes[0], owner, when, hashes if len(hashes) > 1 else ())

    def to_json(self) -> dict[str, Any]:
        """The record as stored and shown: `photos_sha256` only when it covers several photos."""
        record = asdict(self)
        if not self.photos_sha256:
            del record["photos_sha256"]
        else:
            record["photos_sha256"] = list(self.photos_sha256)
        return record

    @classmethod
    def from_json(cls, raw: Any) -> Consent:
        """A stored record; ValueError when it is not one."""
        if not isinstance(raw, dict):
            raise ValueError("consent is not an object")
        photos = raw.get("photos_sha256", [])
        if not isinstance(photos, list) or not all(isinstance(p, str) for p in photos):
            raise ValueError("consent record is malformed (photos_sha256 is not a list of hashes)")
        try:
            consent = cls(**{**raw, "photos_sha256": tuple(photos)})
        except TypeError as exc:
            raise ValueError(f"consent record is malformed ({exc})") from None
        texts_or_none = (consent.attestation, consent.owner)
        if (
            consent.statement not in STATEMENTS
            or not isinstance(consent.photo_sha256, str)
            or not all(re.fullmatch(r"[0-9a-f]{64}", h) for h in (consent.photo_sha256, *consent.photos_sha256))
            or (consent.photos_sha256 and consent.photos_sha256[0] != consent.photo_sha256)
            or not isinstance(consent.time, str)
            or not all(v is None or isinstance(v, str) for v in texts_or_none)
        ):
            raise ValueError("consent record is malformed")
        return consent
