"""Bad input gets a 4xx with a reason, never a 5xx: malformed, oversized and mistyped offers, unknown identities
and sessions, malformed JSON, and a bounded fuzz loop over every body-taking route."""

import asyncio
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from aiortc import RTCConfiguration, RTCPeerConnection

from app.bench.rtc_client import StampedTrack
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import PAGE_HEADERS, RunningServer, server_settings, start_server, upload

SDP = {"Content-Type": "application/sdp"}


def real_offer() -> str:
    async def make() -> str:
        pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
        pc.addTransceiver(StampedTrack([np.zeros((48, 64, 3), np.uint8)]), direction="sendrecv")
        await pc.setLocalDescription(await pc.createOffer())
        offer = pc.localDescription.sdp
        await pc.close()
        return offer

    return asyncio.run(make())


@pytest.fixture(scope="module")
def offer() -> str:
    return real_offer()


@pytest.fixture(scope="module")
def identity(server: RunningServer, tom_png: bytes) -> str:
    return str(upload(server.base_url, tom_png, "tom.png").json()["id"])


def drop_lines(offer: str, prefix: str) -> str:
    return "\r\n".join(line for line in offer.split("\r\n") if not line.startswith(prefix))


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        (lambda offer: "hello", 400, "must start with v=0"),
        (lambda offer: "v=0\r\nm=video\r\n", 400, "SDP"),
        (lambda offer: offer.replace("m=video", "m=audio").replace("VP8/90000", "opus/48000/2"), 400, ""),
        (lambda offer: drop_lines(offer, "a=ice-ufrag"), 400, "ICE"),
        (lambda offer: drop_lines(offer, "a=fingerprint"), 400, "DTLS fingerprint"),
        (lambda offer: drop_lines(offer, "a=rtcp-mux"), 400, "RTCP mux"),
        (lambda offer: offer + offer[offer.index("m=video") :], 400, "more than one video"),
        (lambda offer: drop_lines(offer, "a=rtpmap").replace("H264", "AV1X"), 400, ""),
        (lambda offer: offer[: len(offer) // 3], 400, ""),
        (lambda offer: "v=0\r\n" + "a=x\r\n" * 30000, 413, "limit"),
    ],
    ids=[
        "garbage",
        "bare-m-line",
        "audio-only",
        "no-ice",
        "no-fingerprint",
        "no-rtcp-mux",
        "two-videos",
        "no-codecs",
        "truncated",
        "oversized",
    ],
)
def test_bad_offers_get_4xx_with_a_reason(
    server: RunningServer, identity: str, offer: str, body: Callable[[str], str], status: int, reason: str
) -> None:
    response = httpx.post(f"{server.base_url}/v1/sessions?identity={identity}", content=body(offer), headers=SDP)
    assert response.status_code == status, response.text
    assert reason in response.json()["detail"]
    assert len(server.state.sessions or []) == 0


def test_session_requests_that_are_wrong_before_the_offer_is_read(
    server: RunningServer, identity: str, offer: str
) -> None:
    base = server.base_url
    wrong_type = httpx.post(
        f"{base}/v1/sessions?identity={identity}", content=offer, headers={"Content-Type": "text/plain", **PAGE_HEADERS}
    )
    assert wrong_type.status_code == 415 and "application/sdp" in wrong_type.json()["detail"]
    no_type = httpx.post(f"{base}/v1/sessions?identity={identity}", content=offer, headers=PAGE_HEADERS)
    assert no_type.status_code == 415
    unknown = httpx.post(f"{base}/v1/sessions?identity={'f' * 32}", content=offer, headers=SDP)
    assert unknown.status_code == 404 and "not found" in unknown.json()["detail"]
    odd = httpx.post(f"{base}/v1/sessions?identity=../../etc/passwd", content=offer, headers=SDP)
    assert odd.status_code == 404
    missing = httpx.post(f"{base}/v1/sessions", content=offer, headers=SDP)
    assert missing.status_code == 422 and "identity" in missing.json()["detail"]
    binary = httpx.post(f"{base}/v1/sessions?identity={identity}", content=b"v=0\r\n\xff\xfe", headers=SDP)
    assert binary.status_code == 400 and "UTF-8" in binary.json()["detail"]
    declared = httpx.post(f"{base}/v1/sessions?identity={identity}", content=b"v=0\r\n" + b"a" * 200_000, headers=SDP)
    assert declared.status_code == 413


def test_unknown_sessions_and_malformed_json(server: RunningServer, identity: str) -> None:
    base = server.base_url
    ghost = f"{base}/v1/sessions/{'a' * 32}"
    assert httpx.get(ghost).status_code == 404
    assert httpx.delete(ghost).status_code == 404
    assert httpx.patch(ghost, json={"identity": identity}).status_code == 404
    assert httpx.patch(ghost, content=b"{not json", headers={"Content-Type": "application/json"}).status_code == 422
    assert httpx.patch(ghost, json={"identity": 5}).status_code == 422
    assert httpx.patch(ghost, json=[1, 2]).status_code == 422
    assert httpx.patch(ghost, content=b"x" * 100_000, headers={"Content-Type": "application/json"}).status_code == 413


def test_streams_validate_the_source_before_anything_else(server: RunningServer, identity: str) -> None:
    url = f"{server.base_url}/v1/streams"
    for source, reason in [
        ("http://example.com/a.mp4", "unsupported source scheme"),
        ("ftp://host/x", "unsupported source scheme"),
        ("rtsp://", "no host"),
        ("rtsp://host:99999/x", "not a valid URL"),
        ("/etc/passwd", "file sources are off"),
        ("file:///etc/passwd", "file sources are off"),
        ("rtsp://cam\x01/x", "control characters"),
    ]:
        response = httpx.post(url, json={"source_url": source, "identity": identity})
        assert response.status_code == 422, (source, response.text)
        assert reason in response.json()["detail"], (source, response.text)
    assert httpx.post(url, json={"identity": identity}).status_code == 422
    assert httpx.post(url, json={"source_url": "rtsp://cam/x"}).status_code == 422
    assert httpx.get(f"{url}/{'b' * 32}").status_code == 404
    assert httpx.delete(f"{url}/{'b' * 32}").status_code == 404
    # RTSP is off in these tests: a valid request says so instead of failing later.
    off = httpx.post(url, json={"source_url": "rtsp://127.0.0.1:9/x", "identity": identity})
    assert off.status_code == 503 and "RTSP output is off" in off.json()["detail"]


def mutations(offer: str, rng: random.Random) -> Iterator[tuple[str, bytes, dict[str, str]]]:
    """Endless malformed requests: (method and path, body, headers)."""
    lines = offer.split("\r\n")
    alphabet = "=:/ \r\n\t0123456789abcdefxyzv-_.;,\x00\x7f\u00e9\u4e2d"
    while True:
        kind = rng.randrange(9)
        if kind == 0:
            cut = rng.sample(range(len(lines)), k=min(len(lines), rng.randint(1, 6)))
            text = "\r\n".join(line for i, line in enumerate(lines) if i not in cut)
        elif kind == 1:
            text = offer[: rng.randrange(len(offer))]
        elif kind == 2:
            chars = list(offer)
            for _ in range(rng.randint(1, 30)):
                chars[rng.randrange(len(chars))] = rng.choice(alphabet)
            text = "".join(chars)
        elif kind == 3:
            shuffled = lines[1:]
            rng.shuffle(shuffled)
            text = "\r\n".join([lines[0], *shuffled])
        elif kind == 4:
            i = rng.randrange(len(lines))
            text = "\r\n".join(lines[:i] + [lines[i]] * rng.randint(2, 50) + lines[i + 1 :])
        elif kind == 5:
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 400)))
        elif kind == 6:
            body = bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))
            yield "POST /v1/sessions", body, {"Content-Type": rng.choice(["application/sdp", "application/json", ""])}
            continue
        elif kind == 7:
            value = rng.choice([None, 1, [], {}, "x" * rng.randint(0, 90), "\x00", "a" * 32])
            field = rng.choice(["identity", "source_url", "nope"])
            yield (
                rng.choice(["PATCH /v1/sessions/x", "POST /v1/streams"]),
                json.dumps({field: value}).encode(),
                {"Content-Type": "application/json"},
            )
            continue
        else:
            boundary = "b" + str(rng.randrange(10**6))
            part = bytes(rng.randrange(256) for _ in range(rng.randint(0, 200)))
            body = (
                f'--{boundary}\r\nContent-Disposition: form-data; name="image"; filename="a.png"\r\n\r\n'.encode()
                + rng.choice([b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"RIFF\x00\x00\x00\x00WEBP", b""])
                + part
                + rng.choice([f"\r\n--{boundary}--\r\n".encode(), b"", b"\r\n--"])
            )
            yield "POST /v1/identities", body, {"Content-Type": f"multipart/form-data; boundary={boundary}"}
            continue
        yield "POST /v1/sessions", text.encode("utf-8", "surrogatepass"), {"Content-Type": "application/sdp"}


@pytest.mark.slow
def test_fuzzed_requests_never_get_a_5xx(
    identity_dir: Path,
    pipeline_factory: Callable[[PipelineSettings], FramePipeline],
    tom_png: bytes,
    offer: str,
) -> None:
    settings = server_settings(identity_dir, max_sessions=50, connect_timeout_s=2.0)
    rng = random.Random(20261202)
    statuses: dict[int, int] = {}
    with start_server(settings, pipeline_factory) as server:
        identity = upload(server.base_url, tom_png, "tom.png").json()["id"]
        with httpx.Client(base_url=server.base_url, timeout=30) as http:
            for count, (target, body, headers) in enumerate(mutations(offer, rng)):
                if count >= 400:
                    break
                method, path = target.split(" ")
                if path == "/v1/sessions":
                    path += f"?identity={identity}"
                response = http.request(method, path, content=body, headers=headers)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                assert response.status_code < 500, (target, body[:300], response.text)
                if response.status_code == 201 and method == "POST" and path.startswith("/v1/sessions"):
                    assert http.delete(response.headers["location"]).status_code in (204, 404)  # may have ended
            assert http.get("/readyz").status_code == 200
        assert len(server.state.sessions or []) == 0
    assert sum(v for k, v in statuses.items() if 400 <= k < 500) >= 300, statuses


def test_audio_settings_outside_their_documented_ranges_get_422_and_the_delay_never_goes_negative(
    server: RunningServer, identity: str, offer: str
) -> None:
    base = server.base_url
    created = httpx.post(f"{base}/v1/sessions?identity={identity}", content=offer, headers=SDP)
    assert created.status_code == 201, created.text
    audio = f"{base}{created.headers['location']}/audio"
    try:
        for body in (
            {"offset_ms": -1001},
            {"offset_ms": 1001},
            {"offset_ms": True},
            {"offset_ms": 1.5},
            {"enabled": 1},
        ):
            answer = httpx.patch(audio, json=body, headers=PAGE_HEADERS)
            assert answer.status_code == 422, (body, answer.text)
        earliest = httpx.patch(audio, json={"offset_ms": -1000}, headers=PAGE_HEADERS)
        assert earliest.status_code == 200 and earliest.json()["offset_ms"] == -1000
        assert earliest.json()["delay_ms"] == 0.0
    finally:
        httpx.delete(f"{base}{created.headers['location']}", headers=PAGE_HEADERS)
