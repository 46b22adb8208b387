"""Browser-origin safety and the edges of authentication on a real server: a page elsewhere cannot act on a
local server (foreign Origin, foreign Host, simple form POSTs), the page gets its security headers, failures
are answered with a Bearer challenge after a growing delay, and the audit log records it all without secrets."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from app.auth.settings import AccessSettings
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.credentials import JWT_AUDIENCE, JWT_ISSUER, JWT_SECRET, bearer, make_credentials, token
from tests.server.harness import PAGE_HEADERS, RunningServer, server_settings, start_server, upload


def no_models(_: PipelineSettings) -> FramePipeline:
    """Servers for these tests never load models: the checks run before any route needs them."""
    raise RuntimeError("no models in this test")


def light_server(tmp_path: Path, **access: object) -> RunningServer:
    settings = server_settings(tmp_path / "identities", access=AccessSettings(**access), warmup=False)
    return start_server(settings, no_models, wait_ready=False)


def identity_count(server: RunningServer) -> int:
    return len(httpx.get(f"{server.base_url}/v1/identities").json()["identities"])


def test_a_cross_site_form_cannot_upload_to_a_local_server(server: RunningServer, tom_png: bytes) -> None:
    before = identity_count(server)
    files = {"image": ("tom.png", tom_png)}
    url = f"{server.base_url}/v1/identities"
    from_evil = httpx.post(url, files=files, headers={"Origin": "http://evil.example"})
    assert from_evil.status_code == 403 and "cross-origin" in from_evil.json()["detail"]
    # Even a page that got its header through (or an old browser without Origin) needs the page's header.
    no_origin = httpx.post(url, files=files)
    assert no_origin.status_code == 403 and "X-Swapcast" in no_origin.json()["detail"]
    evil_with_header = httpx.post(url, files=files, headers={"Origin": "http://evil.example", **PAGE_HEADERS})
    assert evil_with_header.status_code == 403
    opaque = httpx.post(url, files=files, headers={"Origin": "null", **PAGE_HEADERS})
    assert opaque.status_code == 403
    assert identity_count(server) == before
    same_origin = upload(server.base_url, tom_png, headers={"Origin": server.base_url, **PAGE_HEADERS})
    assert same_origin.status_code == 201, same_origin.text
    assert identity_count(server) == before + 1


def test_state_changes_from_a_foreign_origin_are_refused_whatever_the_body(server: RunningServer) -> None:
    evil = {"Origin": "https://evil.example", **PAGE_HEADERS}
    stream = httpx.post(
        f"{server.base_url}/v1/streams", json={"source_url": "rtsp://x/y", "identity": "a"}, headers=evil
    )
    assert stream.status_code == 403
    delete = httpx.delete(f"{server.base_url}/v1/identities/{'a' * 32}", headers=evil)
    assert delete.status_code == 403
    # Reading is harmless without CORS: the browser does not hand a foreign page the answer.
    assert httpx.get(f"{server.base_url}/healthz", headers=evil).status_code == 200


def test_a_foreign_host_header_is_refused_so_dns_rebinding_gets_nothing(server: RunningServer) -> None:
    for path in ("/", "/v1/identities", "/v1/server", "/metrics", "/static/app.js"):
        response = httpx.get(f"{server.base_url}{path}", headers={"Host": "attacker.example"})
        assert response.status_code == 400, path
        assert "Host" in response.json()["detail"]
    # Probes answer whatever the Host (a kubelet uses the pod address): they reveal nothing.
    assert httpx.get(f"{server.base_url}/healthz", headers={"Host": "10.1.2.3:8000"}).status_code == 200
    for host in (f"localhost:{server.port}", f"127.0.0.1:{server.port}", "LOCALHOST"):
        assert httpx.get(f"{server.base_url}/healthz", headers={"Host": host}).status_code == 200


def test_cors_is_off_by_default(server: RunningServer) -> None:
    preflight = httpx.options(
        f"{server.base_url}/v1/identities",
        headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in preflight.headers


def test_cors_allows_exactly_the_configured_origins(tmp_path: Path) -> None:
    with light_server(tmp_path, cors_origins=["https://studio.example"]) as server:
        url = f"{server.base_url}/v1/identities"
        allowed = httpx.options(
            url, headers={"Origin": "https://studio.example", "Access-Control-Request-Method": "POST"}
        )
        assert allowed.headers.get("access-control-allow-origin") == "https://studio.example"
        other = httpx.options(url, headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert "access-control-allow-origin" not in other.headers
        delete = httpx.delete(f"{url}/{'a' * 32}", headers={"Origin": "https://studio.example"})
        assert delete.status_code == 404  # through the origin check to the route


def test_the_page_is_served_with_a_restrictive_policy(server: RunningServer) -> None:
    page = httpx.get(f"{server.base_url}/")
    policy = page.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy and "script-src 'self'" in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    assert page.headers["x-frame-options"] == "DENY"
    script = httpx.get(f"{server.base_url}/static/app.js")
    assert script.headers["x-content-type-options"] == "nosniff"
    assert httpx.get(f"{server.base_url}/healthz").headers["x-content-type-options"] == "nosniff"


@pytest.mark.slow
def test_failures_get_a_bearer_challenge_after_a_growing_delay_and_the_audit_log_keeps_only_key_ids(
    tmp_path: Path,
) -> None:
    creds = make_credentials(tmp_path / "keys.json")
    audit = tmp_path / "audit.log"
    with light_server(tmp_path, keys_file=creds.keys_file, audit_log=str(audit), auth_failure_delay_s=0.2) as server:
        url = f"{server.base_url}/v1/identities"
        missing = httpx.get(url)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"] == 'Bearer realm="swapcast"'
        took = []
        for _ in range(3):
            start = time.monotonic()
            bad = httpx.get(url, headers=bearer(creds.bad_key))
            took.append(time.monotonic() - start)
            assert bad.status_code == 401
            assert bad.headers["www-authenticate"] == 'Bearer realm="swapcast", error="invalid_token"'
        # One failure before these: the waits are about 0.4, 0.6 and 0.8 s (timing on a busy machine: loose).
        assert took[0] >= 0.35 and took[2] >= 0.75 and took[2] > took[0], took
        assert httpx.get(url, headers=bearer(creds.owner)).status_code == 200
        assert httpx.get(url, headers=bearer(creds.without["identities:read"])).status_code == 403
    lines = [json.loads(line) for line in audit.read_text().splitlines()]
    events = [line["event"] for line in lines]
    assert events.count("auth_failure") == 4 and "key_first_use" in events and "auth_forbidden" in events
    owner_id = creds.owner.split("_")[1]
    assert any(line.get("key_id") == owner_id for line in lines if line["event"] == "key_first_use")
    text = audit.read_text()
    for key in (creds.owner, creds.bad_key, creds.without["identities:read"]):
        assert key.split("_", 2)[2] not in text


def test_a_valid_jwt_is_a_principal_with_its_scopes_and_bad_tokens_are_refused(tmp_path: Path) -> None:
    settings = {
        "keys_file": tmp_path / "none.json",
        "jwt_secret": JWT_SECRET,
        "jwt_issuer": JWT_ISSUER,
        "jwt_audience": JWT_AUDIENCE,
        "auth_failure_delay_s": 0.0,
    }
    with light_server(tmp_path, **settings) as server:
        url = f"{server.base_url}/v1/identities"
        assert httpx.get(url, headers=bearer(token())).status_code == 200
        assert httpx.get(url, headers=bearer(token({"scope": "sessions"}))).status_code == 403
        assert httpx.get(url, headers=bearer(token({"scp": ["identities:read"]}))).status_code == 200
        now = int(time.time())
        refused = {
            "expired": token({"exp": now - 600}),
            "not yet valid": token({"nbf": now + 600}),
            "wrong audience": token({"aud": "another-service"}),
            "wrong issuer": token({"iss": "https://evil.example"}),
            "unsigned": token(key=None, algorithm="none"),
            "forged": token(key="another-secret-that-is-long-enough-to-sign!"),
        }
        for what, jwt_token in refused.items():
            response = httpx.get(url, headers=bearer(jwt_token))
            assert response.status_code == 401, what
            assert response.headers["www-authenticate"].startswith("Bearer"), what


def test_credentials_are_checked_before_anything_else_is_said(tmp_path: Path) -> None:
    """A server without its models answers 503, but only to callers that may hear it."""
    creds = make_credentials(tmp_path / "keys.json")
    with light_server(tmp_path, keys_file=creds.keys_file, auth_failure_delay_s=0.0) as server:
        base = server.base_url
        sdp = {"content": "v=0", "headers": {"Content-Type": "application/sdp", "X-Swapcast": "1"}}
        assert httpx.post(f"{base}/v1/sessions?identity=x", **sdp).status_code == 401
        assert httpx.get(f"{base}/v1/streams").status_code == 401
        assert httpx.patch(f"{base}/v1/sessions/x", json={"identity": 5}).status_code == 401
        owner = {**sdp["headers"], "Authorization": f"Bearer {creds.owner}"}
        assert httpx.post(f"{base}/v1/sessions?identity=x", content="v=0", headers=owner).status_code == 503
