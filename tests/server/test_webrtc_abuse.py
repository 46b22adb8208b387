"""WebRTC abuse: offers that would hold a slot without sending video, offers with hundreds of candidates, clients
that never connect, per-principal capacity with an honest Retry-After, and media addresses that follow the bind
host."""

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from app.media.peer import use_host_addresses
from app.pipeline.pipeline import FramePipeline
from app.server.media_addresses import media_host_addresses
from app.settings import PipelineSettings
from tests.server.harness import RunningServer, server_settings, start_server, upload
from tests.server.test_bad_input import real_offer

SDP = {"Content-Type": "application/sdp"}
PipelineFactory = Callable[[PipelineSettings], FramePipeline]


@pytest.fixture(scope="module")
def offer() -> str:
    return real_offer()


@pytest.fixture(scope="module")
def identity(server: RunningServer, tom_png: bytes) -> str:
    return str(upload(server.base_url, tom_png, "tom.png").json()["id"])


def _post(base: str, identity: str, offer: str) -> httpx.Response:
    return httpx.post(f"{base}/v1/sessions?identity={identity}", content=offer, headers=SDP, timeout=30)


@pytest.mark.parametrize("direction", ["recvonly", "inactive"])
def test_offers_that_send_no_video_are_refused(
    server: RunningServer, identity: str, offer: str, direction: str
) -> None:
    refused = _post(server.base_url, identity, offer.replace("a=sendrecv", f"a={direction}"))
    assert refused.status_code == 400 and direction in refused.json()["detail"]
    assert httpx.get(f"{server.base_url}/v1/sessions").json()["sessions"] == []


def test_offers_with_hundreds_of_candidates_are_refused(server: RunningServer, identity: str, offer: str) -> None:
    lines = "".join(f"a=candidate:{i} 1 udp 2122260223 127.0.0.1 {20000 + i} typ host\r\n" for i in range(300))
    flood = offer.replace("a=end-of-candidates", lines + "a=end-of-candidates", 1)
    assert flood != offer
    refused = _post(server.base_url, identity, flood)
    assert refused.status_code == 400 and "at most 16" in refused.json()["detail"]


@pytest.mark.slow
def test_sessions_that_never_connect_free_their_slot_fast_and_retry_after_is_honest(
    identity_dir: Path, pipeline_factory: PipelineFactory, offer: str, tom_png: bytes
) -> None:
    """Canned offers with no peer behind them: per-principal capacity refuses the third, Retry-After says when
    the first ICE deadline passes, and the slots free after the ICE timeout, not the 15 s connect timeout."""
    settings = server_settings(identity_dir, max_sessions=4, max_sessions_per_principal=2, ice_timeout_s=2.0)
    with start_server(settings, pipeline_factory) as server:
        base = server.base_url
        identity = upload(base, tom_png).json()["id"]
        started = time.monotonic()
        assert [_post(base, identity, offer).status_code for _ in range(2)] == [201, 201]
        third = _post(base, identity, offer)
        assert third.status_code == 503 and "you hold 2" in third.json()["detail"]
        assert 1 <= int(third.headers["Retry-After"]) <= 3
        while httpx.get(f"{base}/v1/sessions").json()["sessions"]:
            assert time.monotonic() - started < 6.0, "sessions that never connected still hold their slots"
            time.sleep(0.1)
        closed = server.state.metrics.sessions_closed.labels("ICE timeout")._value.get()
        assert closed == 2


def test_media_addresses_follow_the_bind_host(identity_dir: Path) -> None:
    assert media_host_addresses(server_settings(identity_dir, host="127.0.0.1")) == ["127.0.0.1"]
    assert media_host_addresses(server_settings(identity_dir, host="localhost")) == ["127.0.0.1"]
    assert media_host_addresses(server_settings(identity_dir, host="0.0.0.0")) is None
    explicit = server_settings(identity_dir, host="0.0.0.0", ice_host_addresses=["10.1.2.3"])
    assert media_host_addresses(explicit) == ["10.1.2.3"]


def test_an_answer_without_candidates_is_a_503_not_a_201(
    identity_dir: Path, pipeline_factory: PipelineFactory, offer: str, tom_png: bytes
) -> None:
    """192.0.2.1 (TEST-NET) is no address of this machine: nothing binds, so no candidate can be offered."""
    try:
        with start_server(server_settings(identity_dir, ice_host_addresses=["192.0.2.1"]), pipeline_factory) as server:
            identity = upload(server.base_url, tom_png).json()["id"]
            refused = _post(server.base_url, identity, offer)
            assert refused.status_code == 503 and "no usable address" in refused.json()["detail"]
            assert httpx.get(f"{server.base_url}/v1/sessions").json()["sessions"] == []
    finally:
        use_host_addresses(["127.0.0.1"])
