"""ICE for real networks: TURN credentials minted by swapcast are accepted by a real coturn running the
repository's config (and expired or foreign ones refused), the page gets them from /v1/ice-servers, and the
advertised address replaces the private one in a real aiortc SDP."""

import asyncio
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.sdp import SessionDescription
from fastapi.testclient import TestClient
from pydantic import ValidationError

from app.auth.keys import KeyStore
from app.auth.settings import AccessSettings
from app.media.advertise import advertise_host_candidates
from app.server.app import create_app
from app.server.ice import IceSettings, mint_turn_credential
from app.settings import PipelineSettings
from tests.server.harness import server_settings

ROOT = Path(__file__).resolve().parents[2]
SECRET = "test-shared-secret"


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture()
def turn_port(tmp_path: Path) -> Iterator[int]:
    if shutil.which("turnserver") is None or shutil.which("turnutils_uclient") is None:
        pytest.skip("coturn is not installed (scripts/setup-dev.sh installs it)")
    port = _free_udp_port()
    log = tmp_path / "turn.log"
    out = log.open("w")
    proc = subprocess.Popen(
        ["turnserver", "-c", str(ROOT / "deploy" / "coturn" / "turnserver.conf"),
         f"--static-auth-secret={SECRET}", "--listening-ip=127.0.0.1", "--relay-ip=127.0.0.1",
         f"--listening-port={port}", "--no-tls", "--no-dtls", f"--pidfile={tmp_path / 'turn.pid'}",
         f"--userdb={tmp_path / 'turndb'}"],
        stdout=out,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while "Total General servers" not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < deadline, "turnserver did not start"
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        proc.wait(10)
        out.close()


def _allocate(port: int, username: str, password: str) -> str:
    done = subprocess.run(
        ["turnutils_uclient", "-u", username, "-w", password, "-p", str(port), "-y", "-n", "1", "-m", "1",
         "-l", "64", "127.0.0.1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return done.stdout + done.stderr


def test_coturn_accepts_minted_credentials_and_refuses_expired_or_foreign_ones(turn_port: int) -> None:
    username, password = mint_turn_credential(SECRET, "session-1", ttl_s=600)
    accepted = _allocate(turn_port, username, password)
    assert "Cannot complete Allocation" not in accepted, accepted
    # Allocated; the relay to a loopback peer is then refused by the config's peer deny list.
    assert "403 (Forbidden IP)" in accepted, accepted

    expired = mint_turn_credential(SECRET, "session-1", ttl_s=600, now=time.time() - 700)
    assert "Cannot complete Allocation" in _allocate(turn_port, *expired)
    foreign = mint_turn_credential("another-secret", "session-1", ttl_s=600)
    assert "Cannot complete Allocation" in _allocate(turn_port, *foreign)


def _no_models(settings: PipelineSettings) -> object:
    raise RuntimeError("no models in this test")


def test_ice_servers_route_mints_turn_credentials_per_call(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SWAPCAST_TURN_URLS", '["turn:turn.example.org:3478?transport=udp"]')
    monkeypatch.setenv("SWAPCAST_TURN_SECRET", SECRET)
    settings = server_settings(tmp_path, ice_servers=["stun:stun.example.org:3478"])
    with TestClient(create_app(settings, _no_models), base_url="http://127.0.0.1") as client:  # type: ignore[arg-type]
        body = client.get("/v1/ice-servers").json()
    stun, turn = body["iceServers"]
    assert stun == {"urls": ["stun:stun.example.org:3478"]}
    assert turn["urls"] == ["turn:turn.example.org:3478?transport=udp"]
    expiry, label = turn["username"].split(":", 1)
    assert label == "local" and 3500 <= int(expiry) - time.time() <= 3600  # local mode's one principal
    assert (turn["username"], turn["credential"]) == mint_turn_credential(SECRET, "local", 3600, now=int(expiry) - 3600)
    assert body["ttl_s"] == 3600


def test_turn_credentials_name_their_principal_and_minting_is_rate_limited(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("SWAPCAST_TURN_URLS", '["turn:turn.example.org:3478?transport=udp"]')
    monkeypatch.setenv("SWAPCAST_TURN_SECRET", SECRET)
    keys_file = tmp_path / "keys.json"
    store = KeyStore(keys_file)
    alice, bob = (store.create(name, ["sessions"])[1] for name in ("alice", "bob"))
    settings = server_settings(
        tmp_path,
        access=AccessSettings(keys_file=keys_file, auth_failure_delay_s=0.0),
        rate_credentials="3/minute",
    )
    with TestClient(create_app(settings, _no_models), base_url="http://127.0.0.1") as client:  # type: ignore[arg-type]

        def mint(key: str) -> Any:
            return client.get("/v1/ice-servers", headers={"Authorization": f"Bearer {key}"})

        labels = [mint(key).json()["iceServers"][0]["username"].split(":", 1)[1] for key in (alice, bob)]
        assert labels == ["key-alice", "key-bob"]
        # The third credential minted from this address within the minute is the last, whoever asks.
        assert [mint(alice).status_code, mint(alice).status_code] == [200, 429]
        assert "too many credentials" in mint(bob).json()["detail"]


def test_turn_credential_lifetimes_are_capped() -> None:
    with pytest.raises(ValidationError, match="longer than SWAPCAST_TURN_TTL_MAX_H"):
        IceSettings(turn_ttl_s=13 * 3600)
    with pytest.raises(ValidationError):
        IceSettings(turn_ttl_max_h=7 * 24)
    assert IceSettings(turn_ttl_s=20 * 3600, turn_ttl_max_h=24).turn_ttl_s == 20 * 3600


def test_turn_settings_are_checked() -> None:
    with pytest.raises(ValidationError, match="need credentials"):
        IceSettings(turn_urls=["turn:turn.example.org"])
    with pytest.raises(ValidationError, match="not a turn"):
        IceSettings(turn_urls=["stun:stun.example.org"], turn_secret="x")
    with pytest.raises(ValidationError, match="not both"):
        IceSettings(turn_urls=["turn:t"], turn_secret="x", turn_username="u", turn_credential="c")


def test_advertised_address_replaces_host_candidates_in_a_real_sdp() -> None:
    async def offer() -> str:
        pc = RTCPeerConnection()
        pc.addTransceiver("video", direction="recvonly")
        await pc.setLocalDescription(await pc.createOffer())
        sdp = pc.localDescription.sdp
        await pc.close()
        return str(sdp)

    original = asyncio.run(offer())
    rewritten = advertise_host_candidates(original, "203.0.113.10")
    parsed = SessionDescription.parse(rewritten)
    hosts = [c for m in parsed.media for c in m.ice_candidates if c.type == "host" and ":" not in c.ip]
    assert hosts and all(c.ip == "203.0.113.10" for c in hosts)
    ports = [c.port for m in SessionDescription.parse(original).media for c in m.ice_candidates if ":" not in c.ip]
    assert [c.port for c in hosts] == ports  # ports stay: the NAT forwards them one to one
    assert RTCSessionDescription(sdp=rewritten, type="offer").sdp == rewritten
