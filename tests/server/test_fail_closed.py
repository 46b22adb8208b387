"""Access control fails closed on a live server: once keys are configured, revoking the last one, emptying the
keys file or deleting it leaves a server that refuses everyone; a damaged or unsafe keys file gets 503 without
server paths, `/readyz` says so, and `serve` refuses to start with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.auth.keys import KeyStore
from app.auth.settings import AccessSettings
from app.cli import main
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.credentials import bearer
from tests.server.harness import RunningServer, server_settings, start_server
from tests.server.test_local_mode import REPO, first_lines, get_when_listening, serve, stop

# What an anonymous caller must never get once keys were configured: the session list (RTSP logins), uploads,
# TURN credentials, the server's state.
GUARDED = ("/v1/sessions", "/v1/streams", "/v1/identities", "/v1/ice-servers", "/v1/server")


def statuses(server: RunningServer, credential: str | None) -> dict[str, int]:
    return {path: httpx.get(f"{server.base_url}{path}", headers=bearer(credential)).status_code for path in GUARDED}


@pytest.fixture()
def keyed_server(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> tuple[RunningServer, Path]:
    keys_file = tmp_path / "keys.json"
    settings = server_settings(
        tmp_path / "identities", access=AccessSettings(keys_file=keys_file, auth_failure_delay_s=0.0)
    )
    KeyStore(keys_file).create("admin", ["admin"])
    return start_server(settings, pipeline_factory), keys_file


@pytest.mark.slow
def test_revoking_emptying_or_deleting_the_keys_leaves_a_server_that_refuses_everyone(
    keyed_server: tuple[RunningServer, Path],
) -> None:
    server, keys_file = keyed_server
    with server:
        store = KeyStore(keys_file)
        _, key = store.create("alice", ["sessions", "streams", "identities:read", "identities:write"])
        assert set(statuses(server, key).values()) == {200}
        for record in store.records():
            if record.active:
                store.revoke(record.id)
        assert set(statuses(server, None).values()) == {401}
        assert set(statuses(server, key).values()) == {401}
        keys_file.write_text(json.dumps({"version": 1, "keys": []}))
        assert set(statuses(server, None).values()) == {401}
        keys_file.unlink()
        assert set(statuses(server, None).values()) == {401}
        assert set(statuses(server, "Bearer garbage").values()) == {401}
        # A key created afterwards works again.
        _, fresh = KeyStore(keys_file).create("bob", ["sessions"])
        assert httpx.get(f"{server.base_url}/v1/sessions", headers=bearer(fresh)).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["json", "mode"])
def test_a_damaged_or_unsafe_keys_file_answers_503_without_paths_and_readyz_says_why(
    keyed_server: tuple[RunningServer, Path], damage: str
) -> None:
    server, keys_file = keyed_server
    with server:
        _, key = KeyStore(keys_file).create("alice", ["sessions"])
        if damage == "json":
            keys_file.write_text("{damaged")
        else:
            keys_file.chmod(0o666)
        for credential in (None, key):
            answer = httpx.get(f"{server.base_url}/v1/sessions", headers=bearer(credential))
            if credential is None:
                assert answer.status_code == 401  # nothing to check: refused as always
                continue
            assert answer.status_code == 503
            assert str(keys_file.parent) not in answer.text and "keys.json" not in answer.text
            assert "keys file is unreadable" in answer.json()["detail"]
        ready = httpx.get(f"{server.base_url}/readyz")
        assert ready.status_code == 503 and ready.json()["reason"].startswith("access control unavailable")
        assert str(keys_file.parent) not in ready.text
        if damage == "json":
            KeyStore(keys_file.with_name("fresh.json")).create("alice", ["sessions"])
            keys_file.with_name("fresh.json").replace(keys_file)
        else:
            keys_file.chmod(0o600)
        assert httpx.get(f"{server.base_url}/readyz").status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["json", "mode"])
def test_serve_refuses_to_start_on_loopback_with_a_damaged_or_unsafe_keys_file(
    tmp_path: Path, model_root: Path, damage: str
) -> None:
    keys_file = tmp_path / "keys.json"
    KeyStore(keys_file).create("admin", ["admin"])
    if damage == "json":
        keys_file.write_text("{damaged")
    else:
        keys_file.chmod(0o664)
    proc = serve([], model_root, tmp_path, SWAPCAST_KEYS_FILE=str(keys_file))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("swapcast: error: "), err
    assert ("cannot read the keys file" if damage == "json" else "chmod 600") in lines[0]
    assert "Traceback" not in err


def test_revoking_the_last_key_says_what_a_running_server_will_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys_file = tmp_path / "keys.json"
    store = KeyStore(keys_file)
    store.create("alice", ["sessions"])
    store.create("root", ["admin"])
    assert main(["keys", "--keys-file", str(keys_file), "revoke", "alice"]) == 0
    assert "last active key" not in capsys.readouterr().out
    assert main(["keys", "--keys-file", str(keys_file), "revoke", "root"]) == 0
    said = capsys.readouterr().out
    assert "that was the last active key" in said and "refuses every request (401)" in said
    assert "does not fall back to local mode" in said


PROXY_HEADERS = {
    "X-Forwarded-Proto": "https",
    "Via": "1.1 proxy",
    "X-Forwarded-Host": "swapcast.example.com",
    "CF-Connecting-IP": "203.0.113.7",
    "True-Client-IP": "203.0.113.7",
    "X-Client-IP": "203.0.113.7",
}


@pytest.mark.slow
def test_drain_needs_the_admin_scope_once_credentials_are_configured(
    keyed_server: tuple[RunningServer, Path],
) -> None:
    server, keys_file = keyed_server
    with server:
        store = KeyStore(keys_file)
        _, owner = store.create("alice", ["sessions", "streams", "identities:read", "identities:write", "metrics"])
        _, admin = store.create("operator", ["admin"])
        url = f"{server.base_url}/v1/server/drain"
        # From loopback, with no credential or a garbage one (the probe's way in), with or without proxy headers.
        for headers in ({}, {"Authorization": "Bearer garbage"}, PROXY_HEADERS):
            assert httpx.post(url, headers={"X-Swapcast": "1", **headers}).status_code == 401, headers
        assert httpx.post(url, headers=bearer(owner)).status_code == 403
        assert httpx.get(f"{server.base_url}/readyz").status_code == 200
        # Behind a proxy every client is loopback: the credential decides, wherever the request came from.
        drained = httpx.post(url, headers={**bearer(admin), **PROXY_HEADERS})
        assert drained.status_code == 202 and drained.json()["draining"] is True
        assert httpx.get(f"{server.base_url}/readyz").status_code == 503


@pytest.mark.slow
@pytest.mark.parametrize("header", sorted(PROXY_HEADERS))
def test_in_local_mode_a_drain_through_any_proxy_header_is_refused(server: RunningServer, header: str) -> None:
    answer = httpx.post(
        f"{server.base_url}/v1/server/drain", headers={"X-Swapcast": "1", header: PROXY_HEADERS[header]}
    )
    assert answer.status_code == 403 and "not through a proxy" in answer.json()["detail"]
    assert httpx.get(f"{server.base_url}/readyz").status_code == 200


@pytest.mark.slow
def test_swapcast_drain_signs_an_admin_token_with_the_shared_jwt_secret(tmp_path: Path, model_root: Path) -> None:
    jwt_env = {"SWAPCAST_JWT_SECRET": "a-drain-test-secret-of-at-least-32-bytes!", "SWAPCAST_JWT_AUDIENCE": "swapcast"}
    proc = serve([], model_root, tmp_path, SWAPCAST_KEYS_FILE=str(tmp_path / "none.json"), **jwt_env)
    try:
        lines = first_lines(proc, "  loading models")
        base = next(line for line in lines if line.startswith("swapcast serving on ")).rsplit(" ", 1)[1]
        get_when_listening(f"{base}/healthz")
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        drain = [sys.executable, "-m", "app.cli", "drain", "--url", base]
        refused = subprocess.run(drain, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert refused.returncode == 2 and "refused to drain (401)" in refused.stderr, refused.stderr
        done = subprocess.run(drain, env={**env, **jwt_env}, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["draining"] is True
    finally:
        stop(proc)
