"""API keys: shown once, stored as salted hashes, checked in constant time, revocable, re-read when the file
changes; the `swapcast keys` command around them."""

import json
import os
import stat
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from app.auth.keys import KEY_PATTERN, KeyStore, KeyStoreError, key_id_of

REPO = Path(__file__).resolve().parents[2]


def test_a_key_is_random_shown_once_and_only_its_salted_hash_is_stored(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    record, key = store.create("obs", ["sessions"])
    other_record, other = store.create("obs", ["sessions"])
    assert KEY_PATTERN.match(key) and key != other
    secret = key.split("_", 2)[2]
    assert len(secret) == 43  # 32 random bytes, URL-safe base64: 256 bits
    text = (tmp_path / "keys.json").read_text()
    assert secret not in text and key not in text
    stored = json.loads(text)["keys"]
    assert {k["id"] for k in stored} == {record.id, other_record.id}
    assert stored[0]["salt"] != stored[1]["salt"]
    assert stat.S_IMODE(os.stat(tmp_path / "keys.json").st_mode) == 0o600
    assert store.verify(key) == record


def test_wrong_unknown_malformed_and_revoked_keys_are_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    record, key = store.create("alice", ["identities:read"])
    assert store.verify(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert store.verify("sk_000000000000_" + "A" * 43) is None
    assert store.verify("not a key") is None
    assert store.verify("") is None
    assert key_id_of(key) == record.id and key_id_of("junk") is None
    store.revoke(record.id)
    assert store.verify(key) is None
    assert store.revoked_ids() == {record.id}
    with pytest.raises(KeyStoreError, match="no active key"):
        store.revoke(record.id)


def test_a_running_reader_sees_keys_created_and_revoked_by_another_writer(tmp_path: Path) -> None:
    reader = KeyStore(tmp_path / "keys.json")
    assert not reader.has_active()
    writer = KeyStore(tmp_path / "keys.json")
    record, key = writer.create("bob", ["streams"])
    assert reader.has_active() and reader.verify(key) == record
    writer.revoke("bob")
    assert reader.verify(key) is None and not reader.has_active()


def test_a_damaged_keys_file_is_an_error_not_an_open_door(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text("{not json")
    with pytest.raises(KeyStoreError, match="cannot read the keys file"):
        KeyStore(path).verify("sk_000000000000_" + "A" * 43)


def test_invalid_names_and_empty_scopes_are_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    with pytest.raises(KeyStoreError, match="invalid key name"):
        store.create("has space", ["sessions"])
    with pytest.raises(KeyStoreError, match="at least one"):
        store.create("ok", [])


def swapcast(*args: str, keys_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "app.cli", "keys", "--keys-file", str(keys_file), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


@pytest.mark.slow
def test_keys_command_creates_lists_and_revokes(tmp_path: Path) -> None:
    keys_file = tmp_path / "data" / "keys.json"
    created = swapcast("create", "obs", "--scope", "sessions", "--scope", "identities:read", keys_file=keys_file)
    assert created.returncode == 0, created.stderr
    key = created.stdout.splitlines()[0]
    assert KEY_PATTERN.match(key)
    key_id = key_id_of(key)
    listed = swapcast("list", keys_file=keys_file)
    assert key_id in listed.stdout and "obs" in listed.stdout and "active" in listed.stdout
    assert key not in listed.stdout and key.split("_", 2)[2] not in listed.stdout
    revoked = swapcast("revoke", "obs", keys_file=keys_file)
    assert revoked.returncode == 0 and key_id in revoked.stdout
    assert "revoked" in swapcast("list", keys_file=keys_file).stdout

    bad = swapcast("create", "x", "--scope", "root", keys_file=keys_file)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "swapcast: error: unknown scope 'root'; choose from: identities:write, identities:read, sessions, streams, "
        "metrics, admin"
    ]
    again = swapcast("revoke", "obs", keys_file=keys_file)
    assert again.returncode == 2 and again.stderr.startswith("swapcast: error: no active key")


def test_concurrent_writers_lose_no_key(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"

    def create(i: int) -> str:
        return KeyStore(path).create(f"writer-{i}", ["sessions"])[0].id

    with ThreadPoolExecutor(8) as pool:
        made = set(pool.map(create, range(16)))
    assert {r.id for r in KeyStore(path).records()} == made and len(made) == 16


def test_names_and_keys_with_a_final_newline_are_refused(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.json")
    with pytest.raises(KeyStoreError, match="invalid key name"):
        store.create("obs\n", ["sessions"])
    record, key = store.create("obs", ["sessions"])
    assert store.verify(key) == record
    assert store.verify(key + "\n") is None and key_id_of(key + "\n") is None
