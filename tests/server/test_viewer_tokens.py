"""Viewer tokens and revocation of viewers, with real aiortc clients: a token minted for one output opens WHEP
viewers of that output and nothing else, revoking it (or the key that opened a viewer, or deleting that key from
the keys file by hand) stops the viewer's frames, and the token never reaches a log line."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from app.auth.keys import KeyStore, key_id_of
from app.auth.settings import AccessSettings
from app.bench.rtc_client import RtcClient
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for_async as wait_for
from tests.server.credentials import bearer
from tests.server.harness import RunningServer, server_settings, start_server, upload
from tests.server.test_local_mode import REPO, first_lines, get_when_listening
from tests.server.test_whep import WhepViewer

pytestmark = pytest.mark.slow
FPS = 15
SESSIONS_SCOPES = ["sessions", "streams", "identities:read", "identities:write"]


@dataclass
class Keyed:
    server: RunningServer
    keys_file: Path
    alice: str  # the session's owner
    alice_viewer: str  # a second key of the same principal (key:alice), used only to watch
    bob: str
    admin: str


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> Iterator[Keyed]:
    root = tmp_path_factory.mktemp("viewer-tokens")
    keys_file = root / "keys.json"
    store = KeyStore(keys_file)
    keys = [store.create(*spec)[1] for spec in (("alice", SESSIONS_SCOPES),) * 2 + (("bob", SESSIONS_SCOPES),)]
    admin = store.create("root", ["admin"])[1]
    settings = server_settings(
        root / "identities",
        access=AccessSettings(keys_file=keys_file, auth_failure_delay_s=0.0),
        max_sessions=4,
    )
    with start_server(settings, pipeline_factory) as server:
        yield Keyed(server, keys_file, keys[0], keys[1], keys[2], admin)


async def new_session(http: httpx.AsyncClient, identity: str, clip: MotionClip) -> tuple[RtcClient, str]:
    client = RtcClient(clip.frames, fps=FPS)
    response = await client.connect(http, f"/v1/sessions?identity={identity}")
    assert response.status_code == 201, response.text
    assert await client.wait_frames(3, 90), "the session sent no frames"
    return client, (client.location or "").rsplit("/", 1)[1]


def frames_stop(viewer: WhepViewer) -> Callable[[], bool]:
    """A check that is true once `viewer` received nothing new for a second."""
    seen = {"count": -1, "at": time.monotonic()}

    def stopped() -> bool:
        count = len(viewer.received)
        if count != seen["count"]:
            seen["count"], seen["at"] = count, time.monotonic()
        return time.monotonic() - seen["at"] > 1.0

    return stopped


def test_revoking_a_key_stops_the_viewers_it_opened_and_a_key_deleted_by_hand_counts_as_revoked(
    keyed: Keyed, tom_png: bytes, clip: MotionClip
) -> None:
    identity = upload(keyed.server.base_url, tom_png, headers=bearer(keyed.alice)).json()["id"]
    base = keyed.server.base_url

    async def run() -> None:
        async with (
            httpx.AsyncClient(base_url=base, timeout=30, headers=bearer(keyed.alice)) as owner,
            httpx.AsyncClient(base_url=base, timeout=30, headers=bearer(keyed.alice_viewer)) as watcher,
        ):
            client, session_id = await new_session(owner, identity, clip)
            viewer = WhepViewer()
            assert (await viewer.connect(watcher, f"/v1/sessions/{session_id}/whep")).status_code == 201
            assert await wait_for(lambda: len(viewer.received) >= 5, 60), "the viewer got no frames"

            key_id = key_id_of(keyed.alice_viewer)
            assert key_id is not None
            await asyncio.to_thread(KeyStore(keyed.keys_file).revoke, key_id)
            assert await wait_for(frames_stop(viewer), 10), "the revoked key's viewer still receives frames"
            sent = len(client.result.received)
            assert await client.wait_frames(sent + 5, 30), "the owner's session stopped with the viewer's key"
            await viewer.close()

            # The session's own key, deleted from the file by hand rather than revoked: the session ends.
            owner_id = key_id_of(keyed.alice)
            body = json.loads(keyed.keys_file.read_text())
            body["keys"] = [k for k in body["keys"] if k["id"] != owner_id]
            keyed.keys_file.write_text(json.dumps(body))
            admin = bearer(keyed.admin)
            ended = await wait_for(
                lambda: httpx.get(f"{base}/v1/sessions/{session_id}", headers=admin).status_code == 404, 10
            )
            assert ended, "the session of a key deleted from the keys file is still live"
            await client.close()

    asyncio.run(run())


def test_a_viewer_token_opens_only_its_outputs_viewers_and_revoking_it_stops_them(
    keyed: Keyed, tom_png: bytes, clip: MotionClip
) -> None:
    base = keyed.server.base_url
    alice = KeyStore(keyed.keys_file).create("carol", SESSIONS_SCOPES)[1]  # the test above revokes alice's keys
    identity = upload(base, tom_png, headers=bearer(alice)).json()["id"]

    async def run() -> None:
        async with httpx.AsyncClient(base_url=base, timeout=30, headers=bearer(alice)) as owner:
            client, session_id = await new_session(owner, identity, clip)
            other_client, other_id = await new_session(owner, identity, clip)
            minted = await owner.post(f"/v1/sessions/{session_id}/viewer-tokens")
            assert minted.status_code == 201, minted.text
            grant = minted.json()
            token = grant["token"]
            assert token.startswith("vt_") and grant["view_url"] == f"/view/{session_id}?token={token}"
            assert grant["whep_url"] == f"/v1/sessions/{session_id}/whep"

            # The owner's own viewer, to check a token cannot stop what it did not open.
            owners_viewer = WhepViewer()
            assert (await owners_viewer.connect(owner, grant["whep_url"])).status_code == 201

            async with httpx.AsyncClient(base_url=base, timeout=30, headers=bearer(token)) as holder:
                viewer = WhepViewer()
                assert (await viewer.connect(holder, grant["whep_url"])).status_code == 201
                assert await wait_for(lambda: len(viewer.received) >= 5, 60), "the token's viewer got no frames"
                # Nothing else: no listing, reading, switching, ending, minting, TURN, other outputs.
                refused = {
                    ("GET", "/v1/sessions"): 401,
                    ("GET", f"/v1/sessions/{session_id}"): 401,
                    ("PATCH", f"/v1/sessions/{session_id}"): 401,
                    ("DELETE", f"/v1/sessions/{session_id}"): 401,
                    ("GET", f"/v1/sessions/{session_id}/whep"): 401,
                    ("POST", f"/v1/sessions/{session_id}/viewer-tokens"): 401,
                    ("GET", f"/v1/sessions/{session_id}/audio"): 401,
                    ("GET", "/v1/ice-servers"): 401,
                    ("GET", "/v1/identities"): 401,
                    ("GET", "/v1/server"): 401,
                }
                for (method, path), status in refused.items():
                    kwargs = {"json": {"identity": identity}} if method == "PATCH" else {}
                    answer = await holder.request(method, path, **kwargs)
                    assert answer.status_code == status, (method, path, answer.status_code, answer.text)
                other = WhepViewer()
                assert (await other.connect(holder, f"/v1/sessions/{other_id}/whep")).status_code == 404
                await other.close()
                assert owners_viewer.location is not None
                assert (await holder.delete(owners_viewer.location)).status_code == 404

                # Listed for the owner without its secret; another owner does not see the session at all.
                listed = (await owner.get(f"/v1/sessions/{session_id}/viewer-tokens")).json()["viewer_tokens"]
                assert [t["id"] for t in listed] == [grant["id"]] and token not in json.dumps(listed)
                bob = await owner.post(f"/v1/sessions/{session_id}/viewer-tokens", headers=bearer(keyed.bob))
                assert bob.status_code == 404

                revoked = await owner.delete(f"/v1/sessions/{session_id}/viewer-tokens/{grant['id']}")
                assert revoked.status_code == 204
                assert await wait_for(frames_stop(viewer), 10), "the revoked token's viewer still receives frames"
                assert len(owners_viewer.received) > 0
                again = WhepViewer()
                assert (await again.connect(holder, grant["whep_url"])).status_code == 401
                await again.close()
                await viewer.close()
            await owners_viewer.close()
            await client.close()
            await other_client.close()

    asyncio.run(run())


def test_the_viewer_page_is_framed_by_nobody_and_tokens_are_redacted_from_the_access_log(
    tmp_path: Path, model_root: Path
) -> None:
    secret = "vt_0123456789abcdef_" + "S" * 43
    verbose = subprocess.Popen(  # `swapcast -v serve`: uvicorn's access log on
        [sys.executable, "-m", "app.cli", "-v", "serve", "--port", "0", "--no-rtsp", "--identity-dir", str(tmp_path)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO)},
    )
    try:
        lines = first_lines(verbose, "  loading models")
        base = next(line for line in lines if line.startswith("swapcast serving on ")).rsplit(" ", 1)[1]
        page = get_when_listening(f"{base}/view/abc?token={secret}&audio=1")
        assert page.status_code == 200
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert page.headers["x-frame-options"] == "DENY"
        assert "<style>" not in page.text and httpx.get(f"{base}/static/view.css").status_code == 200
        assert httpx.get(f"{base}/view/stream/abc?token={secret}").status_code == 200
        assert httpx.get(f"{base}/view/channel/abc?tok%65n={secret}").status_code == 200  # read as `token`
    finally:
        verbose.terminate()
        output, _ = verbose.communicate(timeout=30)
    logged = "\n".join(lines) + output
    assert "/view/abc?token=[redacted]&audio=1" in logged, logged[-2000:]
    assert "/view/channel/abc?tok%65n=[redacted]" in logged, logged[-2000:]
    assert secret not in logged and "S" * 43 not in logged
