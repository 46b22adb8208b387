"""Per-client-address limits that apply before authentication: POSTs to the API, and failed authentications
(after which the address is refused before its credentials are checked), answered 429 with Retry-After, while
/healthz, /readyz and /metrics keep answering."""

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest

from app.auth.settings import AccessSettings
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.credentials import Credentials, make_credentials
from tests.server.harness import PAGE_HEADERS, RunningServer, server_settings, start_server

PipelineFactory = Callable[[PipelineSettings], FramePipeline]
BODY = {"source_url": "rtsp://192.0.2.1/x", "identity": "0" * 32}


@dataclass
class Limited:
    server: RunningServer
    creds: Credentials


@pytest.fixture
def limited(tmp_path_factory: pytest.TempPathFactory, pipeline_factory: PipelineFactory) -> Iterator[Limited]:
    root = tmp_path_factory.mktemp("address-limit")
    creds = make_credentials(root / "keys.json")
    settings = server_settings(
        root / "identities",
        access=AccessSettings(keys_file=creds.keys_file, auth_failure_delay_s=0.0),
        rate_per_address="3/minute",
        rate_auth_failures="2/minute",
    )
    with start_server(settings, pipeline_factory) as server:
        yield Limited(server, creds)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _probes_answer(base: str, creds: Credentials) -> None:
    assert httpx.get(f"{base}/healthz").status_code == 200
    assert httpx.get(f"{base}/readyz").status_code == 200
    assert httpx.get(f"{base}/metrics", headers=_bearer(creds.admin)).status_code == 200


def test_posts_per_address_are_limited_before_authentication(limited: Limited) -> None:
    """A valid key whose own per-principal rates are far away still meets the address's budget, and so does an
    unauthenticated request: its 429 comes before authentication (not the 401 it would get)."""
    base, creds = limited.server.base_url, limited.creds
    statuses = [httpx.post(f"{base}/v1/streams", json=BODY, headers=_bearer(creds.owner)).status_code for _ in range(3)]
    assert 429 not in statuses
    over = httpx.post(f"{base}/v1/streams", json=BODY, headers=_bearer(creds.owner))
    assert over.status_code == 429 and "3 per 1 minute" in over.json()["detail"]
    assert 1 <= int(over.headers["Retry-After"]) <= 60
    anonymous = httpx.post(f"{base}/v1/sessions?identity={'0' * 32}", content=b"v=0", headers=PAGE_HEADERS)
    assert anonymous.status_code == 429
    # Reading is not a POST: the owner can still look around, and the probes answer.
    assert httpx.get(f"{base}/v1/identities", headers=_bearer(creds.owner)).status_code == 200
    _probes_answer(base, creds)


def test_failed_authentications_block_the_address_before_credentials_are_checked(limited: Limited) -> None:
    base, creds = limited.server.base_url, limited.creds
    guesses = [httpx.get(f"{base}/v1/identities", headers=_bearer(creds.bad_key)) for _ in range(2)]
    assert [g.status_code for g in guesses] == [401, 401]
    blocked = httpx.get(f"{base}/v1/identities", headers=_bearer(creds.bad_key))
    assert blocked.status_code == 429 and "failed authentications" in blocked.json()["detail"]
    assert 1 <= int(blocked.headers["Retry-After"]) <= 60
    # Even the right key is not looked at from this address until the window moves.
    assert httpx.get(f"{base}/v1/identities", headers=_bearer(creds.owner)).status_code == 429
    _probes_answer(base, creds)
