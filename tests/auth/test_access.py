"""Who a request acts for, without a server: local mode is decided once and only ever ends, and a keys file
that other users could change is refused."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from app.auth.access import KEYS_UNREADABLE, Access, Unauthenticated
from app.auth.keys import KeyStore, KeyStoreError
from app.auth.settings import AccessSettings


def access_for(keys_file: Path) -> Access:
    return Access(AccessSettings(keys_file=keys_file), bind_host="127.0.0.1")


def test_local_mode_ends_with_the_first_key_and_never_comes_back(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    access = access_for(keys_file)
    assert access.local_mode and access.authenticate(None).id == "local"

    store = KeyStore(keys_file)
    record, _ = store.create("admin", ["admin"])
    assert not access.local_mode
    store.revoke(record.id)
    for change in ("revoked", "emptied", "deleted"):
        if change == "emptied":
            keys_file.write_text(json.dumps({"version": 1, "keys": []}))
        if change == "deleted":
            keys_file.unlink()
        assert not access.local_mode, change
        with pytest.raises(Unauthenticated):
            access.authenticate(None)
    assert "every request is refused" in access.describe()


@pytest.mark.parametrize("contents", ['{"version": 1, "keys": []}', "not json"])
def test_a_keys_file_present_at_start_up_means_credentials_even_when_empty_or_damaged(
    tmp_path: Path, contents: str
) -> None:
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(contents)
    keys_file.chmod(0o600)
    access = access_for(keys_file)
    assert not access.local_mode
    with pytest.raises((Unauthenticated, KeyStoreError)):
        access.authenticate("sk_0123456789ab_" + "A" * 43)


def test_a_damaged_keys_file_is_reported_without_its_path(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    KeyStore(keys_file).create("admin", ["admin"])
    access = access_for(keys_file)
    keys_file.write_text("{damaged")
    with pytest.raises(KeyStoreError) as refused:
        access.authenticate("sk_0123456789ab_" + "A" * 43)
    assert str(refused.value) == KEYS_UNREADABLE and str(tmp_path) not in str(refused.value)
    assert access.problem() == "access control unavailable: the keys file cannot be read"


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_keys_file_others_can_write_is_refused(tmp_path: Path, mode: int) -> None:
    keys_file = tmp_path / "keys.json"
    store = KeyStore(keys_file)
    store.create("admin", ["admin"])
    keys_file.chmod(mode)
    with pytest.raises(KeyStoreError, match="other users can write it.*chmod 600"):
        KeyStore(keys_file).records()
    # A running server notices the change of mode alone (the contents and time stay the same).
    with pytest.raises(KeyStoreError):
        store.has_active()
    keys_file.chmod(0o600)
    assert store.has_active()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_keys_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    keys_file = tmp_path / "keys.json"
    KeyStore(keys_file).create("admin", ["admin"])
    os.chown(keys_file, 4242, -1)
    with pytest.raises(KeyStoreError, match="belongs to user id 4242"):
        KeyStore(keys_file).records()
