"""A channel's credentials belong to its record, not to its name: after the channel is deleted and a channel of
the same name is made (by its owner or by anyone else), no RTSP login, SRT passphrase or viewer token of the old
one works, on this replica or on another sharing the store. Creating, rotating and deleting are audited, a name
with a final newline is refused, and a channel or push store that other users can write is answered with 503
and the reason."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import av
import httpx
import pytest

from app.auth.keys import KeyStore
from app.auth.settings import AccessSettings
from app.channels.pushes import PushStore
from app.egress.rtsp import rtsp_unavailable_reason
from app.pipeline.pipeline import FramePipeline
from app.server.errors import CHANNEL_STORE_UNUSABLE
from app.settings import PipelineSettings
from tests.server.credentials import USER_SCOPES, bearer
from tests.server.harness import RunningServer, server_settings, start_server
from tests.server.test_channel_restart import frames_from, whep_status
from tests.server.test_channel_srt import SRT_MISSING, decoded, finished, read

RTSP_MISSING = rtsp_unavailable_reason()
pytestmark = pytest.mark.skipif(RTSP_MISSING is not None, reason=f"GStreamer RTSP unavailable: {RTSP_MISSING}")
needs_srt = pytest.mark.skipif(SRT_MISSING is not None, reason=f"SRT cannot run here: {SRT_MISSING}")
SIZE = {"width": 320, "height": 240, "fps": 15}


@dataclass
class Server:
    running: RunningServer
    root: Path
    alice: str
    bob: str

    def call(self, method: str, path: str, key: str, **kwargs: Any) -> httpx.Response:
        url = f"{self.running.base_url}{path}"
        return httpx.request(method, url, headers=bearer(key), timeout=30, **kwargs)

    def audited(self, event: str) -> list[dict[str, Any]]:
        lines = (self.root / "audit.jsonl").read_text().splitlines()
        return [e for e in map(json.loads, lines) if e["event"] == event]


def settings_for(root: Path, keys_file: Path, **overrides: Any) -> Any:
    access = AccessSettings(keys_file=keys_file, auth_failure_delay_s=0.0, audit_log=str(root / "audit.jsonl"))
    return server_settings(root / "identities", access=access, rtsp_enabled=True, rtsp_port=0, **overrides)


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("channel-credentials")
    keys = KeyStore(root / "keys.json")
    alice, bob = (keys.create(name, USER_SCOPES)[1] for name in ("alice", "bob"))
    srt = {"srt_port": 0} if SRT_MISSING is None else {}
    with start_server(settings_for(root, root / "keys.json", **srt), pipeline_factory) as running:
        yield Server(running, root, alice, bob)


@dataclass(frozen=True)
class Held:
    """What a consumer was given for a channel: its RTSP URL (with the login), SRT URL and viewer token."""

    rtsp_url: str
    srt_url: str | None
    whep_url: str
    viewer_token: str

    @classmethod
    def of(cls, body: dict[str, Any]) -> Held:
        return cls(body["rtsp_url"], body["srt_url"], body["whep_url"], body["viewer_token"])


def rtsp_plays(url: str) -> bool:
    try:
        return frames_from(url) == 3
    except av.error.FFmpegError:
        return False


def srt_reads(url: str, out: Path) -> bool:
    code, _ = finished(read(url, out, 2))
    return code == 0 and decoded(out)[0] > 0


def works(server: Server, held: Held, out: Path) -> dict[str, bool]:
    """Which of the credentials in `held` read the channel now."""
    base = server.running.base_url
    result = {
        "rtsp": rtsp_plays(held.rtsp_url),
        "whep": asyncio.run(whep_status(base, held.whep_url, held.viewer_token)) == 201,
    }
    if held.srt_url is not None:
        result["srt"] = srt_reads(held.srt_url, out)
    return result


@pytest.mark.slow
def test_a_deleted_and_remade_channel_refuses_every_credential_of_the_old_one(server: Server, tmp_path: Path) -> None:
    made = server.call("POST", "/v1/channels", server.alice, json={"name": "studio2", **SIZE})
    assert made.status_code == 201, made.text
    held = [Held.of(made.json())]
    rotated = server.call("POST", "/v1/channels/studio2/rotate", server.alice)
    assert rotated.status_code == 200, rotated.text
    held.append(Held.of(rotated.json()))
    assert held[1].rtsp_url != held[0].rtsp_url
    assert set(works(server, held[1], tmp_path / "alice.ts").values()) == {True}  # what alice holds does work
    assert server.call("DELETE", "/v1/channels/studio2", server.alice).status_code == 204

    for number, owner in enumerate((server.bob, server.alice)):  # another principal, then the first again
        again = server.call("POST", "/v1/channels", owner, json={"name": "studio2", **SIZE})
        assert again.status_code == 201, again.text
        for index, old in enumerate(held):
            answers = works(server, old, tmp_path / f"old-{number}-{index}.ts")
            assert set(answers.values()) == {False}, f"old credentials {index} read the new channel: {answers}"
        new = Held.of(again.json())
        assert set(works(server, new, tmp_path / f"new-{number}.ts").values()) == {True}
        held.append(new)
        assert server.call("DELETE", "/v1/channels/studio2", owner).status_code == 204


@pytest.mark.slow
def test_another_replica_refuses_the_old_credentials_of_a_channel_remade_elsewhere(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    keys = KeyStore(tmp_path / "keys.json")
    alice, bob = (keys.create(name, USER_SCOPES)[1] for name in ("alice", "bob"))
    shared = {"channel_dir": tmp_path / "channels"}  # as replicas share it; each has its own identity store
    with (
        start_server(settings_for(tmp_path / "a", tmp_path / "keys.json", **shared), pipeline_factory) as first,
        start_server(settings_for(tmp_path / "b", tmp_path / "keys.json", **shared), pipeline_factory) as second,
    ):
        made = httpx.post(f"{first.base_url}/v1/channels", json={"name": "desk", **SIZE}, headers=bearer(alice))
        assert made.status_code == 201, made.text
        old = made.json()
        seen = httpx.get(f"{second.base_url}/v1/channels/desk", headers=bearer(alice))  # the second replica has it
        assert seen.status_code == 200 and seen.json()["rtsp_url"].split("@")[0] == old["rtsp_url"].split("@")[0]
        assert asyncio.run(whep_status(second.base_url, old["whep_url"], old["viewer_token"])) == 201
        assert rtsp_plays(seen.json()["rtsp_url"])

        assert httpx.delete(f"{first.base_url}/v1/channels/desk", headers=bearer(alice)).status_code == 204
        remade = httpx.post(f"{first.base_url}/v1/channels", json={"name": "desk", **SIZE}, headers=bearer(bob))
        assert remade.status_code == 201, remade.text

        # The second replica: alice's viewer token and login are refused, and the channel is bob's.
        assert asyncio.run(whep_status(second.base_url, old["whep_url"], old["viewer_token"])) in (401, 404)
        assert httpx.get(f"{second.base_url}/v1/channels/desk", headers=bearer(alice)).status_code == 404
        theirs = httpx.get(f"{second.base_url}/v1/channels/desk", headers=bearer(bob))
        assert theirs.status_code == 200, theirs.text
        assert not rtsp_plays(seen.json()["rtsp_url"])
        assert rtsp_plays(theirs.json()["rtsp_url"])
        assert asyncio.run(whep_status(second.base_url, old["whep_url"], remade.json()["viewer_token"])) == 201


def test_a_channel_name_with_a_final_newline_is_refused_and_nothing_is_made(server: Server) -> None:
    for name in ("abc\n", "abc\r\n"):
        refused = server.call("POST", "/v1/channels", server.alice, json={"name": name})
        assert refused.status_code == 422, refused.text
        assert "invalid channel name" in refused.json()["detail"]
    listed = server.call("GET", "/v1/channels", server.alice).json()["channels"]
    assert [c["name"] for c in listed if c["name"].startswith("abc")] == []
    records = server.root / "channels" / "channels.json"
    assert not records.exists() or '"abc' not in records.read_text()


def test_creating_rotating_and_deleting_a_channel_is_audited(server: Server) -> None:
    made = server.call("POST", "/v1/channels", server.bob, json={"name": "audited", **SIZE})
    assert made.status_code == 201, made.text
    assert server.call("POST", "/v1/channels/audited/rotate", server.bob).status_code == 200
    assert server.call("DELETE", "/v1/channels/audited", server.bob).status_code == 204
    bob_key = KeyStore(server.root / "keys.json").records()
    credential = next(r.id for r in bob_key if r.name == "bob")
    events = {
        name: [e for e in server.audited(name) if e["channel"] == "audited"]
        for name in ("channel_created", "channel_rotated", "channel_deleted")
    }
    for name, found in events.items():
        assert len(found) == 1, (name, found)
        assert found[0]["owner"] == "key:bob" and found[0]["principal"] == "key:bob", found[0]
        assert found[0]["credential"] == credential, found[0]
    assert (events["channel_created"][0]["width"], events["channel_created"][0]["height"]) == (320, 240)
    assert events["channel_rotated"][0]["generation"] == 2
    log = (server.root / "audit.jsonl").read_text()
    assert made.json()["viewer_token"] not in log and made.json()["rtsp_url"].split("@")[0] not in log


@pytest.mark.parametrize("file", ["channels.json", "pushes.json"])
def test_a_store_file_others_can_write_is_answered_with_503_and_the_reason(server: Server, file: str) -> None:
    name = f"unsafe-{file.split('.')[0]}"
    assert server.call("POST", "/v1/channels", server.alice, json={"name": name, **SIZE}).status_code == 201
    path = server.root / "channels" / file
    PushStore(path.parent).remove_channel("none")  # writes the push store's file, which no push has made yet
    path.chmod(0o666)
    try:
        asked = [
            server.call("GET", f"/v1/channels/{name}/pushes", server.alice),
            server.call("DELETE", f"/v1/channels/{name}/pushes/0123456789abcdef", server.alice),
        ]
        if file == "channels.json":
            asked += [
                server.call("GET", f"/v1/channels/{name}", server.alice),
                server.call("POST", f"/v1/channels/{name}/rotate", server.alice),
                server.call("POST", "/v1/channels", server.alice, json={"name": "another", **SIZE}),
            ]
        for response in asked:
            assert response.status_code == 503, (response.request.url, response.status_code, response.text)
            assert response.json() == {"detail": CHANNEL_STORE_UNUSABLE}
            assert str(server.root) not in response.text
    finally:
        path.chmod(0o600)
    assert server.call("GET", f"/v1/channels/{name}", server.alice).status_code == 200
    assert server.call("DELETE", f"/v1/channels/{name}", server.alice).status_code == 204
