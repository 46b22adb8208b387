"""Per-owner identity quotas (count and bytes) and rate limits on creating identities, sessions and streams."""

from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import server_settings, start_server, upload

PipelineFactory = Callable[[PipelineSettings], FramePipeline]


def test_identity_count_quota_is_409_with_the_limit(
    identity_dir: Path, pipeline_factory: PipelineFactory, tom_png: bytes
) -> None:
    with start_server(server_settings(identity_dir, max_identities=2), pipeline_factory) as server:
        assert [upload(server.base_url, tom_png).status_code for _ in range(2)] == [201, 201]
        refused = upload(server.base_url, tom_png)
        assert refused.status_code == 409 and "the limit is 2" in refused.json()["detail"]
        first = httpx.get(f"{server.base_url}/v1/identities").json()["identities"][0]["id"]
        assert httpx.delete(f"{server.base_url}/v1/identities/{first}").status_code == 204
        assert upload(server.base_url, tom_png).status_code == 201


def test_identity_bytes_quota_is_413_with_the_limit(
    identity_dir: Path, pipeline_factory: PipelineFactory, tom_png: bytes
) -> None:
    limit = 1024 * 1024
    with start_server(server_settings(identity_dir, max_identity_bytes=limit), pipeline_factory) as server:
        statuses = []
        for _ in range(12):
            response = upload(server.base_url, tom_png)
            statuses.append(response.status_code)
            if response.status_code != 201:
                assert response.status_code == 413 and f"limit of {limit} bytes" in response.json()["detail"]
                break
        assert statuses[0] == 201 and statuses[-1] == 413
        assert server.state.store.usage().bytes <= limit


def test_creations_over_the_rate_get_429_with_retry_after(
    identity_dir: Path, pipeline_factory: PipelineFactory, tom_png: bytes
) -> None:
    settings = server_settings(identity_dir, rate_uploads="2/minute", rate_sessions="1/minute", rate_streams="1/minute")
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        assert [upload(base, tom_png).status_code for _ in range(2)] == [201, 201]
        limited = upload(base, tom_png)
        assert limited.status_code == 429 and "2 per 1 minute" in limited.json()["detail"]
        assert 1 <= int(limited.headers["Retry-After"]) <= 60

        offer = {"content": "v=0\r\n", "headers": {"Content-Type": "application/sdp"}}
        assert httpx.post(f"{base}/v1/sessions?identity={'0' * 32}", **offer).status_code == 404  # type: ignore[arg-type]
        again = httpx.post(f"{base}/v1/sessions?identity={'0' * 32}", **offer)  # type: ignore[arg-type]
        assert again.status_code == 429 and "Retry-After" in again.headers

        body = {"source_url": "rtsp://192.0.2.1/x", "identity": "0" * 32}
        assert httpx.post(f"{base}/v1/streams", json=body).status_code != 429
        assert httpx.post(f"{base}/v1/streams", json=body).status_code == 429


def test_rates_are_validated_at_start_up(identity_dir: Path) -> None:
    with pytest.raises(ValidationError, match="not a rate"):
        server_settings(identity_dir, rate_uploads="lots")
