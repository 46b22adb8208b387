"""The consent statement an upload must carry: what is accepted, and the reason given for what is not."""

import hashlib

import pytest

from app.identity.consent import MAX_ATTESTATION, Consent, ConsentInvalid, ConsentStatement


def test_self_needs_no_attestation_and_obtained_keeps_the_uploaders_words() -> None:
    assert ConsentStatement.parse("self", None) == ConsentStatement("self", None)
    assert ConsentStatement.parse(" Self ", "  ") == ConsentStatement("self", None)
    given = ConsentStatement.parse("obtained", "  my sister Ann,\nwho agreed in writing\x00 on 2 May ")
    assert given == ConsentStatement("obtained", "my sister Ann,\nwho agreed in writing  on 2 May")


@pytest.mark.parametrize(
    ("consent", "attestation", "reason"),
    [
        (None, None, "consent is required"),
        ("", "she agreed", "consent is required"),
        ("yes", None, "must be `self` or `obtained`"),
        ("obtained", None, "needs an `attestation`"),
        ("obtained", " \t\n", "needs an `attestation`"),
        ("obtained", "x" * (MAX_ATTESTATION + 1), f"longer than {MAX_ATTESTATION}"),
        ("self", "x" * (MAX_ATTESTATION + 1), f"longer than {MAX_ATTESTATION}"),
    ],
    ids=["missing", "empty", "unknown", "obtained-without-attestation", "blank-attestation", "too-long", "self-long"],
)
def test_a_missing_or_invalid_statement_is_refused_with_the_reason(
    consent: str | None, attestation: str | None, reason: str
) -> None:
    with pytest.raises(ConsentInvalid, match=reason.replace("`", ".")):
        ConsentStatement.parse(consent, attestation)


def test_the_record_names_the_exact_photo_its_owner_and_time_and_reads_back() -> None:
    photo = b"\x89PNG not really, but bytes all the same"
    given = ConsentStatement.parse("obtained", "my colleague, in writing")
    record = Consent.record(given, upload=photo, owner="key:alice", time="2026-12-02T18:00:00+00:00")
    assert record.photo_sha256 == hashlib.sha256(photo).hexdigest()
    assert (record.statement, record.attestation, record.owner) == ("obtained", "my colleague, in writing", "key:alice")
    stored = {
        "statement": "obtained",
        "attestation": "my colleague, in writing",
        "photo_sha256": record.photo_sha256,
        "owner": "key:alice",
        "time": "2026-12-02T18:00:00+00:00",
    }
    assert Consent.from_json(stored) == record
    broken_records = (
        {**stored, "statement": "maybe"},
        {**stored, "photo_sha256": "abc"},
        {**stored, "time": 5},
        {**stored, "attestation": ["a"]},
        {"statement": "self"},
        [],
    )
    for broken in broken_records:
        with pytest.raises(ValueError):
            Consent.from_json(broken)
