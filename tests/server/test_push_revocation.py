"""A push runs under the key that added it: revoking the key ends the push (the RTMP server sees its stream
end), removes it from the push store, and a restart does not bring it back, while another key's push goes on.
Stored pushes are checked again when the server starts: one whose key was revoked while the server was down
is removed, not started, and a record from before pushes kept their credential runs only where its owner's
credential is certain. Adding, removing and ending pushes are audited, destinations with their secrets hidden."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth.keys import KeyStore, key_id_of
from app.auth.settings import AccessSettings
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.credentials import USER_SCOPES, Credentials, bearer, make_credentials
from tests.server.harness import LOOPBACK_DESTINATIONS, RunningServer, server_settings, start_server
from tests.server.push_servers import NginxRtmp, Reader, free_port, nginx_unavailable
from tests.server.test_push_delivery import add_push, make_channel

pytestmark = pytest.mark.slow
STREAM_KEY = "rtmp-SeCrEt-stream-key"


def settings_for(tmp_path: Path, creds: Credentials) -> Any:
    access = AccessSettings(keys_file=creds.keys_file, auth_failure_delay_s=0.0, audit_log=str(tmp_path / "audit.log"))
    return server_settings(
        tmp_path / "identities", access=access, push_retry_s=0.2, push_retry_max_s=1.0, **LOOPBACK_DESTINATIONS
    )


def pushes(server: RunningServer, channel: str, key: str) -> list[dict[str, Any]]:
    """The channel's pushes as an admin sees them."""
    answer = httpx.get(f"{server.base_url}/v1/channels/{channel}/pushes", headers=bearer(key), timeout=30)
    assert answer.status_code == 200, answer.text
    return list(answer.json()["pushes"])


def stored(tmp_path: Path) -> dict[str, dict[str, Any]]:
    raw = json.loads((tmp_path / "channels" / "pushes.json").read_text())
    return {p["id"]: p for p in raw["pushes"]}


def audited(tmp_path: Path, event: str) -> list[dict[str, Any]]:
    lines = (tmp_path / "audit.log").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == event]


def publishers(nginx: NginxRtmp, name: str) -> list[str]:
    """nginx's connections that published `name` (its log at info level), oldest first."""
    return re.findall(rf"\*(\d+) publish: name='{re.escape(name)}'", nginx.log())


def disconnected(nginx: NginxRtmp, connection: str) -> bool:
    return f"*{connection} disconnect," in nginx.log()


@pytest.mark.skipif(nginx_unavailable() is not None, reason=f"no RTMP server: {nginx_unavailable()}")
def test_revoking_a_key_ends_the_pushes_it_added_and_a_restart_does_not_bring_them_back(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    creds = make_credentials(tmp_path / "keys.json")
    settings = settings_for(tmp_path, creds)
    alice_url, bob_url = (f"rtmp://127.0.0.1:{{port}}/live/{who}-{STREAM_KEY}" for who in ("alice", "bob"))
    with NginxRtmp(tmp_path / "nginx") as nginx:
        alice_url, bob_url = (u.format(port=nginx.port) for u in (alice_url, bob_url))
        with start_server(settings, pipeline_factory) as server:
            make_channel(server, "alice-live", creds.owner)
            make_channel(server, "bob-live", creds.other)
            alices = add_push(server, "alice-live", {"url": alice_url}, creds.owner)
            bobs = add_push(server, "bob-live", {"url": bob_url}, creds.other)
            alice_reader, bob_reader = Reader(alice_url), Reader(bob_url)
            try:
                assert wait_for(lambda: alice_reader.seen.frames and bob_reader.seen.frames, 60), (
                    alice_reader.seen.errors,
                    bob_reader.seen.errors,
                )
                (alice_connection,) = publishers(nginx, f"alice-{STREAM_KEY}")
                key_id = key_id_of(creds.owner)
                assert key_id is not None
                KeyStore(creds.keys_file).revoke(key_id)
                revoked = time.monotonic()
                # The server looks at the keys file twice a second: the push ends and is forgotten.
                assert wait_for(lambda: pushes(server, "alice-live", creds.admin) == [], 5), pushes(
                    server, "alice-live", creds.admin
                )
                assert wait_for(lambda: disconnected(nginx, alice_connection), 5), nginx.log()[-2000:]
                time.sleep(3.0)
            finally:
                alice_reader.stop()
                bob_reader.stop()
            assert alice_reader.seen.frames[-1][0] < revoked + 2.0  # nothing came after the push ended
            assert any(t > revoked + 2.5 for t, _ in bob_reader.seen.frames)  # another key's push goes on
            assert [p["id"] for p in pushes(server, "bob-live", creds.admin)] == [bobs["id"]]
            assert set(stored(tmp_path)) == {bobs["id"]}
            assert stored(tmp_path)[bobs["id"]]["credential"] == key_id_of(creds.other)

        # The server comes back: bob's push with it, alice's not.
        with start_server(settings, pipeline_factory) as server:
            assert pushes(server, "alice-live", creds.admin) == []
            assert wait_for(lambda: pushes(server, "bob-live", creds.admin)[0]["state"] == "live", 30)
            assert wait_for(lambda: len(publishers(nginx, f"bob-{STREAM_KEY}")) == 2, 30)
            time.sleep(2.0)
            assert len(publishers(nginx, f"alice-{STREAM_KEY}")) == 1

    added = {e["push"]: e for e in audited(tmp_path, "push_added")}
    assert added[alices["id"]]["credential"] == key_id and added[alices["id"]]["owner"] == "key:alice"
    assert added[alices["id"]]["channel"] == "alice-live"
    assert added[alices["id"]]["destination"] == f"rtmp://127.0.0.1:{nginx.port}/live/***"
    (ended,) = audited(tmp_path, "push_ended")
    assert (ended["push"], ended["reason"], ended["credential"]) == (alices["id"], "key revoked", key_id)
    assert STREAM_KEY not in (tmp_path / "audit.log").read_text()


def test_stored_pushes_start_only_under_a_credential_that_may_still_run_them(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    creds = make_credentials(tmp_path / "keys.json")
    keys = KeyStore(creds.keys_file)
    twins = [keys.create("twin", USER_SCOPES)[1] for _ in range(2)]  # two keys of one name
    settings = settings_for(tmp_path, creds)
    nowhere = f"rtmp://127.0.0.1:{free_port()}/live/{STREAM_KEY}"  # nothing listens: the pushes retry
    with start_server(settings, pipeline_factory) as server:
        make_channel(server, "alice-ch", creds.owner)
        make_channel(server, "bob-ch", creds.other)
        make_channel(server, "twin-ch", twins[0])
        alices = add_push(server, "alice-ch", {"url": nowhere}, creds.owner)
        bobs = add_push(server, "bob-ch", {"url": nowhere}, creds.other)
        twins_push = add_push(server, "twin-ch", {"url": nowhere}, twins[1])
        removed = add_push(server, "bob-ch", {"url": nowhere}, creds.other)
        answer = httpx.delete(
            f"{server.base_url}/v1/channels/bob-ch/pushes/{removed['id']}", headers=bearer(creds.other), timeout=30
        )
        assert answer.status_code == 204

    # While the server is down, alice's key is revoked; and the store is as an older server wrote it, with no
    # credentials: bob's (his only key) and the twins' (which of the two?) cannot be told apart by name.
    alice_id = key_id_of(creds.owner)
    assert alice_id is not None
    keys.revoke(alice_id)
    path = tmp_path / "channels" / "pushes.json"
    raw = json.loads(path.read_text())
    for record in raw["pushes"]:
        if record["id"] != alices["id"]:
            del record["credential"]
    path.write_text(json.dumps(raw))

    with start_server(settings, pipeline_factory) as server:
        assert pushes(server, "alice-ch", creds.admin) == []
        assert pushes(server, "twin-ch", creds.admin) == []
        (bob,) = pushes(server, "bob-ch", creds.admin)
        assert bob["id"] == bobs["id"] and bob["state"] != "off", bob
    assert set(stored(tmp_path)) == {bobs["id"]}
    assert stored(tmp_path)[bobs["id"]]["credential"] == key_id_of(creds.other)  # adopted: bob's only key

    gone = {e["push"]: e for e in audited(tmp_path, "push_removed")}
    assert gone[removed["id"]]["by"] == "key:bob" and gone[removed["id"]]["credential"] == key_id_of(creds.other)
    ended = {e["push"]: e["reason"] for e in audited(tmp_path, "push_ended")}
    assert ended[alices["id"]] == "key revoked"
    assert "credential" in ended[twins_push["id"]]
    assert set(ended) == {alices["id"], twins_push["id"]}
    assert STREAM_KEY not in (tmp_path / "audit.log").read_text()
