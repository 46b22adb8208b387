"""The identity store keeps the consent statement with the photo it covers, reads identities stored before
consent was recorded, and deletes an identity without leaving a file behind."""

import hashlib
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from app.identity.consent import Consent, ConsentStatement
from app.identity.store import Identity, IdentityNotFound, IdentityStore, IdentityUnreadable, is_identity_id
from app.media.clips import load_sample
from app.pipeline.swap import PreparedSource
from app.pipeline.types import Image
from tests.server.harness import encode

PREPARED = PreparedSource("passthrough", "passthrough:128", np.arange(8, dtype=np.float32))


@pytest.fixture(scope="module")
def photo() -> bytes:
    return encode(load_sample("tom_hanks"), ".png")


def enrol(store: IdentityStore, photo: bytes, consent: ConsentStatement | None) -> Identity:
    record = Consent.record(consent, upload=photo, owner="key:alice") if consent else None
    return store.create(
        name="Tom",
        photo=photo,
        format="png",
        width=10,
        height=10,
        faces=1,
        face_index=None,
        thumbnail=b"\xff\xd8 a thumbnail",
        prepared=PREPARED,
        owner="key:alice",
        consent=record,
    )


def files_under(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def test_consent_is_stored_with_the_uploads_hash_owner_and_time(tmp_path: Path, photo: bytes) -> None:
    store = IdentityStore(tmp_path)
    created = enrol(store, photo, ConsentStatement("obtained", "my colleague, in writing"))
    consent = store.get(created.id).consent
    assert consent is not None and consent == created.consent
    assert (consent.statement, consent.attestation, consent.owner) == (
        "obtained",
        "my colleague, in writing",
        "key:alice",
    )
    assert consent.photo_sha256 == hashlib.sha256(photo).hexdigest()


def test_an_identity_stored_before_consent_was_recorded_reads_without_one_and_stays_usable(
    tmp_path: Path, photo: bytes
) -> None:
    store = IdentityStore(tmp_path)
    identity = enrol(store, photo, None)
    meta = tmp_path / identity.id / "meta.json"
    raw = json.loads(meta.read_text())
    del raw["consent"]  # as written before the field existed
    meta.write_text(json.dumps(raw))
    assert store.get(identity.id).consent is None
    assert [i.id for i in store.list()] == [identity.id]
    loaded = store.load_prepared(identity.id, PREPARED.model_key, "passthrough", lambda image, index: PREPARED)
    assert np.array_equal(loaded.data, PREPARED.data)

    raw["consent"] = {"statement": "perhaps"}
    meta.write_text(json.dumps(raw))
    with pytest.raises(IdentityUnreadable, match="malformed consent"):
        store.get(identity.id)


def test_delete_removes_photo_thumbnail_metadata_and_every_preparation(tmp_path: Path, photo: bytes) -> None:
    store = IdentityStore(tmp_path)
    store.open()
    kept = enrol(store, photo, ConsentStatement("self", None))
    doomed = enrol(store, photo, ConsentStatement("self", None))
    other = PreparedSource("classic", "classic:256", np.ones(4, np.float32))
    store.load_prepared(doomed.id, other.model_key, "classic", lambda image, index: other)  # a second model's
    assert (
        len([f for f in files_under(tmp_path) if f.startswith(doomed.id)]) == 7
    )  # its dir, photo, thumb, meta, prepared/, 2 .npy
    before = files_under(tmp_path)

    store.delete(doomed.id)
    assert files_under(tmp_path) == [f for f in before if not f.startswith(doomed.id)]
    assert not any(doomed.id in f for f in files_under(tmp_path))
    assert store.get(kept.id) == kept
    with pytest.raises(IdentityNotFound):
        store.get(doomed.id)
    with pytest.raises(IdentityNotFound):
        store.delete(doomed.id)


def test_a_preparation_finished_after_the_delete_does_not_bring_files_back(tmp_path: Path, photo: bytes) -> None:
    store = IdentityStore(tmp_path)
    identity = enrol(store, photo, ConsentStatement("self", None))
    preparing, deleted = threading.Event(), threading.Event()
    other = PreparedSource("classic", "classic:256", np.ones(4, np.float32))

    def slow_prepare(image: Image, index: int | None) -> PreparedSource:
        preparing.set()
        assert deleted.wait(10)
        return other

    loader = threading.Thread(
        target=store.load_prepared, args=(identity.id, other.model_key, "classic", slow_prepare), daemon=True
    )
    loader.start()
    assert preparing.wait(10)
    store.delete(identity.id)
    deleted.set()
    loader.join(10)
    assert not loader.is_alive()
    assert files_under(tmp_path) == []


def test_an_identity_id_is_the_whole_string() -> None:
    assert is_identity_id("0123456789abcdef" * 2)
    assert not is_identity_id("0123456789abcdef" * 2 + "\n")
