"""HTTPS served directly (SWAPCAST_TLS_CERT / SWAPCAST_TLS_KEY) with a throwaway CA: the API answers over TLS
to a client that trusts the CA, `serve` prints https URLs, and plain HTTP on the TLS port gets nowhere."""

from __future__ import annotations

import ssl
from pathlib import Path

import httpx
import pytest

from app.auth.settings import AccessSettings
from tests.server.credentials import bearer, make_credentials
from tests.server.harness import server_settings, start_server
from tests.server.test_cross_site import no_models
from tests.server.test_local_mode import first_lines, get_when_listening, serve, stop
from tests.server.tls import make_tls


def test_the_api_answers_over_https_with_a_key(tmp_path: Path) -> None:
    tls = make_tls(tmp_path)
    creds = make_credentials(tmp_path / "keys.json")
    access = AccessSettings(keys_file=creds.keys_file, tls_cert=tls.cert, tls_key=tls.key, auth_failure_delay_s=0.0)
    settings = server_settings(tmp_path / "identities", access=access, warmup=False)
    with start_server(settings, no_models, wait_ready=False, ca_file=tls.ca) as server:
        assert server.base_url.startswith("https://")
        trusted = ssl.create_default_context(cafile=str(tls.ca))
        url = f"{server.base_url}/v1/identities"
        assert httpx.get(url, verify=trusted, headers=bearer(creds.owner)).status_code == 200
        assert httpx.get(url, verify=trusted).status_code == 401
        with pytest.raises(httpx.ConnectError):  # an untrusted certificate is refused by the client
            httpx.get(url, headers=bearer(creds.owner))
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{server.port}/healthz")


@pytest.mark.slow
def test_serve_prints_https_urls_and_answers_over_tls(tmp_path: Path, model_root: Path) -> None:
    tls = make_tls(tmp_path)
    env = {
        "SWAPCAST_KEYS_FILE": str(tmp_path / "none.json"),
        "SWAPCAST_TLS_CERT": str(tls.cert),
        "SWAPCAST_TLS_KEY": str(tls.key),
    }
    proc = serve([], model_root, tmp_path / "identities", **env)
    try:
        lines = first_lines(proc, "  loading models")
        assert lines and lines[0].startswith("swapcast serving on https://127.0.0.1:"), lines
        base = lines[0].rsplit(" ", 1)[1]
        trusted = ssl.create_default_context(cafile=str(tls.ca))
        assert get_when_listening(f"{base}/healthz", verify=trusted).json() == {"status": "alive"}
    finally:
        stop(proc)


@pytest.mark.slow
def test_serve_refuses_a_missing_certificate_with_one_line(tmp_path: Path, model_root: Path) -> None:
    missing = {"SWAPCAST_TLS_CERT": str(tmp_path / "missing.pem"), "SWAPCAST_TLS_KEY": str(tmp_path / "missing.key")}
    proc = serve([], model_root, tmp_path, **missing)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert err.strip().splitlines() == [f"swapcast: error: TLS file not found: {tmp_path / 'missing.pem'}"]
