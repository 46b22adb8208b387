"""Quotas, rate limits and capacity key on the authenticated principal, and a stream answers (and restarts) only
for its owner: two API keys on one server, each with its own budget."""

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.auth.settings import AccessSettings
from app.egress.rtsp import rtsp_unavailable_reason
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.credentials import bearer, make_credentials
from tests.server.harness import SELF_CONSENT, server_settings, start_server

UNAVAILABLE = rtsp_unavailable_reason()
PipelineFactory = Callable[[PipelineSettings], FramePipeline]


def _access(root: Path) -> tuple[AccessSettings, dict[str, str], dict[str, str]]:
    creds = make_credentials(root / "keys.json")
    access = AccessSettings(keys_file=creds.keys_file, auth_failure_delay_s=0.0)
    return access, bearer(creds.owner), bearer(creds.other)


def test_identity_quota_is_per_principal(tmp_path: Path, pipeline_factory: PipelineFactory, tom_png: bytes) -> None:
    access, alice, bob = _access(tmp_path)
    settings = server_settings(tmp_path / "identities", access=access, max_identities=1)
    with start_server(settings, pipeline_factory) as server:
        url = f"{server.base_url}/v1/identities"
        files = {"image": ("tom.png", tom_png)}
        assert httpx.post(url, files=files, data=SELF_CONSENT, headers=alice, timeout=60).status_code == 201
        full = httpx.post(url, files=files, data=SELF_CONSENT, headers=alice, timeout=60)
        assert full.status_code == 409 and "the limit is 1" in full.json()["detail"]
        by_bob = httpx.post(url, files=files, data=SELF_CONSENT, headers=bob, timeout=60)
        assert by_bob.status_code == 201  # bob's own quota
        assert server.state.uploads.usage("key:alice").count == 1
        assert server.state.uploads.usage("key:bob").count == 1


def test_rate_limits_count_the_principal_and_the_address(tmp_path: Path, pipeline_factory: PipelineFactory) -> None:
    access, alice, bob = _access(tmp_path)
    settings = server_settings(tmp_path / "identities", access=access, rate_sessions="1/minute")
    with start_server(settings, pipeline_factory) as server:
        url = f"{server.base_url}/v1/sessions?identity={'0' * 32}"

        def offer(headers: dict[str, str]) -> httpx.Response:
            return httpx.post(url, content="v=0\r\n", headers={**headers, "Content-Type": "application/sdp"})

        assert offer(alice).status_code == 404
        again = offer(alice)
        assert again.status_code == 429 and "per principal" in again.json()["detail"]
        # Bob has his own principal budget, but shares this client address's.
        shared = offer(bob)
        assert shared.status_code == 429 and "per address" in shared.json()["detail"]
        assert int(shared.headers["Retry-After"]) >= 1


@pytest.mark.slow
@pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")
def test_stream_capacity_and_restart_are_per_owner(
    tmp_path: Path, pipeline_factory: PipelineFactory, tom_png: bytes
) -> None:
    access, alice, bob = _access(tmp_path)
    settings = server_settings(
        tmp_path / "identities",
        access=access,
        rtsp_enabled=True,
        rtsp_port=0,
        max_streams=4,
        max_streams_per_principal=1,
        ingest_allowed_networks=["127.0.0.0/8"],
        stream_give_up_attempts=2,
    )
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url

        def identity_of(headers: dict[str, str]) -> str:
            photo = {"image": ("tom.png", tom_png)}
            created = httpx.post(f"{base}/v1/identities", files=photo, data=SELF_CONSENT, headers=headers, timeout=60)
            return str(created.json()["id"])

        def stream_for(headers: dict[str, str], identity: str) -> httpx.Response:
            body = {"source_url": "rtsp://127.0.0.1:9/x", "identity": identity}
            return httpx.post(f"{base}/v1/streams", json=body, headers=headers, timeout=30)

        alices, bobs = identity_of(alice), identity_of(bob)
        created = stream_for(alice, alices)
        assert created.status_code == 201, created.text
        stream_id = created.json()["id"]
        second = stream_for(alice, alices)
        assert second.status_code == 503 and "Retry-After" in second.headers, second.text
        assert stream_for(bob, bobs).status_code == 201  # the global limit has room, and bob holds nothing

        deadline = time.monotonic() + 20
        while (got := httpx.get(f"{base}/v1/streams/{stream_id}", headers=alice).json())["state"] != "failed":
            assert time.monotonic() < deadline, got
            time.sleep(0.2)
        assert httpx.get(f"{base}/v1/streams/{stream_id}", headers=bob).status_code == 404
        assert stream_id not in {s["id"] for s in httpx.get(f"{base}/v1/streams", headers=bob).json()["streams"]}
        assert httpx.post(f"{base}/v1/streams/{stream_id}/restart", headers=bob, timeout=30).status_code == 404
        restarted = httpx.post(f"{base}/v1/streams/{stream_id}/restart", headers=alice, timeout=30)
        assert restarted.status_code == 200 and restarted.json()["state"] != "failed", restarted.text


def test_a_damaged_identity_is_409_to_its_owner_and_unknown_to_others(
    tmp_path: Path, pipeline_factory: PipelineFactory, tom_png: bytes
) -> None:
    creds = make_credentials(tmp_path / "keys.json")
    settings = server_settings(
        tmp_path / "identities", access=AccessSettings(keys_file=creds.keys_file, auth_failure_delay_s=0.0)
    )
    alice, bob, admin = bearer(creds.owner), bearer(creds.other), bearer(creds.admin)
    with start_server(settings, pipeline_factory) as first:
        photo = {"image": ("tom.png", tom_png)}
        identity = httpx.post(
            f"{first.base_url}/v1/identities", files=photo, data=SELF_CONSENT, headers=alice, timeout=60
        ).json()["id"]
    (tmp_path / "identities" / identity / "thumb.jpg").unlink()

    with start_server(settings, pipeline_factory) as second:
        url = f"{second.base_url}/v1/identities/{identity}"
        refused = httpx.get(url, headers=alice)
        assert refused.status_code == 409 and "thumbnail" in refused.json()["detail"]
        assert httpx.get(url, headers=bob).status_code == 404
        server_info = f"{second.base_url}/v1/server"
        assert httpx.get(server_info, headers=bob).json()["identities"] == {"damaged": 1, "damaged_ids": []}
        assert httpx.get(server_info, headers=admin).json()["identities"]["damaged_ids"] == [identity]
        assert httpx.delete(url, headers=bob).status_code == 404
        assert httpx.delete(url, headers=alice).status_code == 204
