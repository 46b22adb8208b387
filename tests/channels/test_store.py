"""The channel store on disk: names, persistence across processes, rotation, and the keys file's rules."""

import base64
import hashlib
import hmac
import json
from dataclasses import replace
from pathlib import Path

import pytest

from app.auth.bearer_secret import StoredSecret, matches, split
from app.auth.viewer_tokens import TOKEN_PATTERN, ViewerTokens
from app.channels.store import ChannelExists, ChannelNameInvalid, ChannelRecord, ChannelStore, ChannelStoreError


def opened(directory: Path) -> ChannelStore:
    store = ChannelStore(directory)
    store.open()
    return store


@pytest.mark.parametrize("name", ["", "Evening", "a b", "../x", "-lead", "x" * 64, "é", "a/b", "a.b"])
def test_names_must_be_url_safe(tmp_path: Path, name: str) -> None:
    with pytest.raises(ChannelNameInvalid):
        opened(tmp_path).create(name, "key:alice", 640, 480, 30)


def test_a_channel_outlives_its_store_object_and_only_hashes_are_kept(tmp_path: Path) -> None:
    store = opened(tmp_path)
    record, token = store.create("evening_show-2", "key:alice", 1280, 720, 30)
    login = store.rtsp_login(record)
    with pytest.raises(ChannelExists):
        store.create("evening_show-2", "key:bob", 640, 480, 30)

    again = opened(tmp_path)  # another process, or the server after a restart
    (loaded,) = again.records()
    assert loaded == record and again.rtsp_login(loaded) == login
    text = (tmp_path / "channels.json").read_text()
    assert token not in text and login[1] not in text
    token_id, secret = split(TOKEN_PATTERN, token)
    assert token_id == loaded.token.id and matches(secret, StoredSecret(loaded.token.salt, loaded.token.hash))
    tokens = ViewerTokens()
    tokens.adopt(loaded.token)
    viewer = tokens.verify(token)
    assert viewer is not None and viewer.watches("channel/evening_show-2")
    assert oct((tmp_path / "channels.json").stat().st_mode & 0o777) == "0o600"
    assert oct((tmp_path / "secret").stat().st_mode & 0o777) == "0o600"


def test_rotation_changes_the_password_and_token_but_not_the_user(tmp_path: Path) -> None:
    store = opened(tmp_path)
    record, token = store.create("desk", "key:alice", 640, 480, 30)
    rotated, new_token = store.rotate("desk")
    old_user, old_password = store.rtsp_login(record)
    new_user, new_password = store.rtsp_login(rotated)
    assert new_user == old_user and new_password != old_password and new_token != token
    assert rotated.generation == record.generation + 1 and rotated.token.id != record.token.id
    assert opened(tmp_path).get("desk") == rotated
    assert store.delete("desk") == rotated and opened(tmp_path).records() == []


def test_another_secret_gives_other_passwords(tmp_path: Path) -> None:
    first = opened(tmp_path / "a")
    second = opened(tmp_path / "b")
    record, _ = first.create("desk", "key:alice", 640, 480, 30)
    assert first.rtsp_login(record) != second.rtsp_login(record)


def test_files_others_can_write_are_refused(tmp_path: Path) -> None:
    store = opened(tmp_path)
    store.create("desk", "key:alice", 640, 480, 30)
    (tmp_path / "channels.json").chmod(0o666)
    with pytest.raises(ChannelStoreError, match="other users can write it"):
        opened(tmp_path)
    (tmp_path / "channels.json").chmod(0o600)
    (tmp_path / "secret").chmod(0o620)
    with pytest.raises(ChannelStoreError, match="other users can write it"):
        opened(tmp_path)


def test_a_damaged_store_is_refused_with_the_reason(tmp_path: Path) -> None:
    opened(tmp_path).create("desk", "key:alice", 640, 480, 30)
    path = tmp_path / "channels.json"
    body = json.loads(path.read_text())
    del body["channels"][0]["token"]
    path.write_text(json.dumps(body))
    with pytest.raises(ChannelStoreError, match="cannot read the channel store"):
        opened(tmp_path)
    (tmp_path / "secret").write_bytes(b"short")
    with pytest.raises(ChannelStoreError, match="damaged"):
        opened(tmp_path)


def old_derivation(store_dir: Path, record: ChannelRecord) -> tuple[str, str]:
    """The login as derived before records had random parts: the secret, the name and the rotation count."""
    secret = (store_dir / "secret").read_bytes()
    user = hmac.new(secret, f"user:{record.name}".encode(), hashlib.sha256).digest()
    password = hmac.new(secret, f"password:{record.name}:{record.generation}".encode(), hashlib.sha256).digest()
    return f"c{user[:6].hex()}", base64.urlsafe_b64encode(password[:18]).decode()


def test_a_name_with_a_final_newline_is_refused_and_nothing_is_made(tmp_path: Path) -> None:
    store = opened(tmp_path)
    for name in ("abc\n", "abc\r\n", "\nabc"):
        with pytest.raises(ChannelNameInvalid):
            store.create(name, "key:alice", 640, 480, 30)
    assert store.records() == [] and opened(tmp_path).records() == []


def test_a_deleted_and_remade_name_gets_credentials_nobody_held_before(tmp_path: Path) -> None:
    store = opened(tmp_path)
    first, first_token = store.create("studio2", "key:alice", 640, 480, 30)
    held = [store.rtsp_login(first)]
    for _ in range(5):  # alice notes the logins of rotations to come, then deletes the channel
        held.append(store.rtsp_login(store.rotate("studio2")[0]))
    store.delete("studio2")
    for owner in ("key:bob", "key:alice"):
        again, token = opened(tmp_path).create("studio2", owner, 640, 480, 30)
        password = store.rtsp_login(again)[1]
        assert all(password != p for _, p in held), "a login of the deleted channel works again"
        assert again.token.id != first.token.id and token != first_token
        for _ in range(5):  # nor does any rotation of the new one land on a login alice saw
            rotated = store.rotate("studio2")[0]
            assert store.rtsp_login(rotated)[1] not in {p for _, p in held}
        store.delete("studio2")


def test_a_rotations_password_cannot_be_computed_from_the_name_and_count(tmp_path: Path) -> None:
    store = opened(tmp_path)
    record, _ = store.create("desk", "key:alice", 640, 480, 30)
    rotated, _ = store.rotate("desk")
    for each in (record, rotated):
        assert store.rtsp_login(each) != old_derivation(tmp_path, each)
        assert store.rtsp_login(each)[1] != old_derivation(tmp_path, each)[1]
    assert rotated.salt != record.salt and rotated.nonce == record.nonce
    # The same generation with another salt is another password: the count alone decides nothing.
    assert store.rtsp_login(replace(rotated, salt=record.salt)) != store.rtsp_login(rotated)


def test_records_from_before_random_parts_get_them_once_and_every_replica_agrees(tmp_path: Path) -> None:
    store = opened(tmp_path)
    store.create("desk", "key:alice", 640, 480, 30)
    path = tmp_path / "channels.json"
    body = json.loads(path.read_text())
    for item in body["channels"]:  # as an older version wrote it
        del item["nonce"], item["salt"]
    path.write_text(json.dumps(body))
    path.chmod(0o600)

    first, second = opened(tmp_path), opened(tmp_path)  # two replicas start on the old file
    (mine,), (theirs,) = first.records(), second.records()
    assert mine == theirs and mine.nonce and mine.salt
    assert first.rtsp_login(mine) == second.rtsp_login(theirs) != old_derivation(tmp_path, mine)
    on_disk = json.loads(path.read_text())["channels"][0]
    assert (on_disk["nonce"], on_disk["salt"]) == (mine.nonce, mine.salt)  # written back, not made up per replica
    with pytest.raises(ChannelStoreError, match="no random parts"):
        first.rtsp_login(replace(mine, nonce="", salt=""))
