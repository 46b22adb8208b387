"""The channel store on disk: names, persistence across processes, rotation, and the keys file's rules."""

import json
from pathlib import Path

import pytest

from app.auth.bearer_secret import StoredSecret, matches, split
from app.auth.viewer_tokens import TOKEN_PATTERN, ViewerTokens
from app.channels.store import ChannelExists, ChannelNameInvalid, ChannelStore, ChannelStoreError


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
