"""Revocation on a live server with real aiortc clients sending stamped frames: deleting an identity stops
every session and stream showing it before the DELETE returns (the last swapped frame arrives within one frame
interval of the answer), and revoking a key ends the sessions started with it."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.auth.keys import KeyStore, key_id_of
from app.auth.settings import AccessSettings
from app.bench.rtc_client import RtcClient
from app.egress.rtsp import rtsp_unavailable_reason
from app.media.clips import MotionClip
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.credentials import bearer, make_credentials
from tests.server.harness import RunningServer, camera_file, server_settings, start_server, upload

FPS = 15


def closed_with(server: RunningServer, reason: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=bearer(None)).text
    prefix = f'swapcast_sessions_closed_total{{reason="{reason}"}} '
    lines = [line for line in text.splitlines() if line.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0


@pytest.mark.slow
def test_deleting_an_identity_ends_its_live_session_within_one_frame(
    server: RunningServer, tom_png: bytes, clip: MotionClip
) -> None:
    identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
    other = upload(server.base_url, tom_png, "tom again.png").json()["id"]
    before = closed_with(server, "identity deleted")

    async def run() -> tuple[RtcClient, float, int, int]:
        client = RtcClient(clip.frames, fps=FPS)
        bystander = RtcClient(clip.frames, fps=FPS)
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as http:
            await client.connect(http, f"/v1/sessions?identity={identity}")
            await bystander.connect(http, f"/v1/sessions?identity={other}")
            assert await client.wait_frames(10, 90), "the session sent no frames"
            assert await bystander.wait_frames(3, 90)
            deleted = await http.delete(f"/v1/identities/{identity}")
            answered = time.monotonic()
            assert deleted.status_code == 204
            await asyncio.sleep(1.5)
            gone = (await http.get(client.location or "")).status_code
            bystander_count = len(bystander.result.received)
            assert await bystander.wait_frames(bystander_count + 3, 30), "a session of another identity stopped"
            await client.close()
            await bystander.close()
            await http.delete(bystander.location or "")
        return client, answered, gone, bystander_count

    client, answered, gone, _ = asyncio.run(run())
    last = max(r.at for r in client.result.received)
    print(f"last swapped frame {1000 * (last - answered):+.1f} ms from the DELETE's answer")
    assert last <= answered + 1 / FPS, f"a frame came {1000 * (last - answered):.0f} ms after the DELETE answered"
    assert gone == 404
    assert closed_with(server, "identity deleted") == before + 1
    cached = server.state.cache.keys()
    assert all(key[0] != identity for key in cached)


@pytest.mark.slow
def test_revoking_a_key_ends_the_sessions_it_started(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
    mark_registry: Path,
) -> None:
    creds = make_credentials(tmp_path / "keys.json")
    audit = tmp_path / "audit.log"
    settings = server_settings(
        tmp_path / "identities",
        access=AccessSettings(keys_file=creds.keys_file, auth_failure_delay_s=0.0, audit_log=str(audit)),
    )
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, headers=bearer(creds.owner)).json()["id"]

        async def run() -> tuple[RtcClient, float, list[int]]:
            client = RtcClient(clip.frames, fps=FPS)
            async with httpx.AsyncClient(base_url=server.base_url, timeout=30, headers=bearer(creds.owner)) as http:
                await client.connect(http, f"/v1/sessions?identity={identity}")
                assert await client.wait_frames(5, 90)
                key_id = key_id_of(creds.owner)
                assert key_id is not None
                await asyncio.to_thread(KeyStore(creds.keys_file).revoke, key_id)
                revoked = time.monotonic()
                admin = {"Authorization": f"Bearer {creds.admin}"}
                ended = await asyncio.to_thread(
                    wait_for,
                    lambda: httpx.get(f"{server.base_url}{client.location}", headers=admin).status_code == 404,
                    5.0,
                )
                assert ended, "the session of a revoked key is still live"
                statuses = [(await http.get("/v1/sessions")).status_code]
                await client.close()
            return client, revoked, statuses

        client, revoked, statuses = asyncio.run(run())
        assert statuses == [401]
        last = max(r.at for r in client.result.received)
        assert last - revoked < 2.0  # the watcher polls the keys file twice a second
        assert closed_with_key(server, creds.admin) == 1.0
    events = [json.loads(line) for line in audit.read_text().splitlines()]
    kinds = [e["event"] for e in events]
    for kind in (
        "key_first_use",
        "identity_created",
        "session_started",
        "key_revoked",
        "session_ended",
        "auth_failure",
    ):
        assert kind in kinds, kind
    ended = next(e for e in events if e["event"] == "session_ended")
    assert ended["reason"] == "key revoked" and ended["owner"] == "key:alice" and ended["identity"] == identity
    created = next(e for e in events if e["event"] == "identity_created")
    assert created["consent"]["statement"] == "self" and created["consent"]["owner"] == "key:alice"
    assert created["consent"]["photo_sha256"] == hashlib.sha256(tom_png).hexdigest()
    # The session's mark is in its start event, and the mark registry names the same owner.
    started = next(e for e in events if e["event"] == "session_started")
    issued = [json.loads(line) for line in mark_registry.read_text().splitlines()]
    (record,) = [r for r in issued if r["mark"] == started["mark"]]
    assert (record["ref"], record["owner"], record["identity"]) == (started["session"], "key:alice", identity)
    assert creds.owner.split("_", 2)[2] not in audit.read_text()


def closed_with_key(server: RunningServer, admin: str) -> float:
    text = httpx.get(f"{server.base_url}/metrics", headers=bearer(admin)).text
    line = next(x for x in text.splitlines() if x.startswith('swapcast_sessions_closed_total{reason="key revoked"}'))
    return float(line.split()[-1])


@pytest.mark.skipif(rtsp_unavailable_reason() is not None, reason="streams need GStreamer RTSP")
def test_deleting_an_identity_ends_the_streams_showing_it(
    tmp_path: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    clip: MotionClip,
) -> None:
    video = camera_file(tmp_path, clip)
    audit = tmp_path / "audit.log"
    settings = server_settings(
        tmp_path / "identities",
        access=AccessSettings(keys_file=tmp_path / "none.json", audit_log=str(audit)),
        rtsp_enabled=True,
        rtsp_port=0,
        allow_file_sources=True,
    )
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        identity = upload(base, tom_png).json()["id"]
        stream = httpx.post(f"{base}/v1/streams", json={"source_url": str(video), "identity": identity}).json()
        assert wait_for(lambda: httpx.get(f"{base}/v1/streams/{stream['id']}").json()["stats"]["frames_out"] > 0, 60)
        assert httpx.delete(f"{base}/v1/identities/{identity}").status_code == 204
        assert httpx.get(f"{base}/v1/streams/{stream['id']}").status_code == 404
        assert server.state.rtsp.client_count([f"/stream/{stream['id']}"]) == 0
        probe = subprocess.run(
            ["ffprobe", "-v", "error", "-rtsp_transport", "tcp", stream["rtsp_url"]],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert probe.returncode != 0  # the path is gone with its login
    ended = [json.loads(line) for line in audit.read_text().splitlines() if '"stream_ended"' in line]
    assert [(e["stream"], e["reason"]) for e in ended] == [(stream["id"], "identity deleted")]
