"""A session's ICE agent as a packet gun: the STUN requests the server sends per second, and the peer-reflexive
candidates it learns from binding requests of unknown addresses, stay under their settings. Counted on real UDP
sockets on loopback, against a real server running aiortc/aioice."""

import re
import secrets
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from aioice import stun

from app.media.ice_bounds import SlidingSecond
from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import RunningServer, server_settings, start_server, upload
from tests.server.test_bad_input import real_offer

SDP = {"Content-Type": "application/sdp"}
CHECKS_PER_S = 5
MAX_PEER_REFLEXIVE = 4
PipelineFactory = Callable[[PipelineSettings], FramePipeline]


@pytest.fixture(scope="module")
def bounded(
    tmp_path_factory: pytest.TempPathFactory, pipeline_factory: PipelineFactory, tom_png: bytes
) -> Iterator[tuple[RunningServer, str]]:
    settings = server_settings(
        tmp_path_factory.mktemp("identities"),
        max_sessions=4,
        ice_checks_per_s=CHECKS_PER_S,
        max_peer_reflexive_candidates=MAX_PEER_REFLEXIVE,
    )
    with start_server(settings, pipeline_factory) as server:
        yield server, str(upload(server.base_url, tom_png).json()["id"])


@pytest.fixture(scope="module")
def offer() -> str:
    return real_offer()


def _sockets(count: int) -> list[socket.socket]:
    sockets = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        sockets.append(sock)
    return sockets


def _with_candidates(offer: str, ports: list[int]) -> str:
    lines = [line for line in offer.split("\r\n") if not line.startswith("a=candidate:")]
    at = lines.index("a=end-of-candidates")
    listed = [f"a=candidate:{i} 1 udp 2122260223 127.0.0.1 {port} typ host" for i, port in enumerate(ports)]
    return "\r\n".join(lines[:at] + listed + lines[at:])


def _received(sockets: list[socket.socket], seconds: float) -> list[tuple[float, int, stun.Message]]:
    """(arrival time, socket index, message) of every STUN packet the sockets get within `seconds`."""
    got = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        idle = True
        for index, sock in enumerate(sockets):
            try:
                data = sock.recv(2048)
            except BlockingIOError:
                continue
            idle = False
            got.append((time.monotonic(), index, stun.parse_message(data)))
        if idle:
            time.sleep(0.002)
    return got


def _post(server: RunningServer, identity: str, offer: str) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/sessions?identity={identity}", content=offer, headers=SDP, timeout=30)


def test_outgoing_checks_stay_under_the_rate(bounded: tuple[RunningServer, str], offer: str) -> None:
    """16 remote candidates (the most an offer may list) at UDP ports that never answer: aioice would start a
    check on each within 0.32 s and retransmit every one; the server sends no more than the setting per second."""
    server, identity = bounded
    targets = _sockets(16)
    try:
        created = _post(server, identity, _with_candidates(offer, [s.getsockname()[1] for s in targets]))
        assert created.status_code == 201, created.text
        got = _received(targets, 2.5)
        session = httpx.get(f"{server.base_url}{created.headers['Location']}").json()
    finally:
        for sock in targets:
            sock.close()
    times = [t for t, _, message in got if message.message_class == stun.Class.REQUEST]
    assert len(times) >= CHECKS_PER_S, "the server sent (almost) no checks: nothing was measured"
    busiest = max(sum(1 for t in times if start <= t < start + 1.0) for start in times)
    assert busiest <= CHECKS_PER_S, f"{busiest} STUN requests in one second; the limit is {CHECKS_PER_S}"
    assert session["ice"]["requests_held_back"] > 0


def test_peer_reflexive_candidates_are_capped(bounded: tuple[RunningServer, str], offer: str) -> None:
    """Authenticated binding requests from 20 source ports the offer never listed: the server answers (and checks
    back) at most the cap of them; the rest get nothing."""
    server, identity = bounded
    created = _post(server, identity, offer)
    assert created.status_code == 201, created.text
    answer = created.text
    server_ufrag = re.search(r"a=ice-ufrag:(\S+)", answer)
    server_pwd = re.search(r"a=ice-pwd:(\S+)", answer)
    client_ufrag = re.search(r"a=ice-ufrag:(\S+)", offer)
    candidate = re.search(r"a=candidate:\S+ 1 udp \d+ (127\.0\.0\.1) (\d+) typ host", answer)
    assert server_ufrag and server_pwd and client_ufrag and candidate, answer
    target = (candidate.group(1), int(candidate.group(2)))

    sources = _sockets(20)
    try:
        for sock in sources:
            request = stun.Message(message_method=stun.Method.BINDING, message_class=stun.Class.REQUEST)
            request.attributes["USERNAME"] = f"{server_ufrag.group(1)}:{client_ufrag.group(1)}"
            request.attributes["PRIORITY"] = 1853824767
            request.attributes["ICE-CONTROLLING"] = secrets.randbits(64)
            request.add_message_integrity(server_pwd.group(1).encode())
            request.add_fingerprint()
            sock.sendto(bytes(request), target)
            time.sleep(0.01)
        got = _received(sources, 1.5)
        session = httpx.get(f"{server.base_url}{created.headers['Location']}").json()
    finally:
        for sock in sources:
            sock.close()
    answered = {index for _, index, message in got if message.message_class == stun.Class.RESPONSE}
    heard = {index for _, index, _ in got}
    assert answered, "no binding request was answered: the requests were not valid checks"
    assert len(heard) <= MAX_PEER_REFLEXIVE, f"{len(heard)} unknown addresses were answered or checked"
    assert session["ice"]["unknown_addresses_dropped"] >= len(sources) - MAX_PEER_REFLEXIVE


def test_an_offer_without_candidates_is_refused_with_what_to_do(bounded: tuple[RunningServer, str], offer: str) -> None:
    """A stock Chromium on a machine with only loopback offers no candidate at all and could never connect."""
    server, identity = bounded
    refused = _post(server, identity, _with_candidates(offer, []))
    assert refused.status_code == 400 and "--allow-loopback-in-peer-connection" in refused.json()["detail"]


def test_the_sliding_second_admits_the_limit_per_second() -> None:
    now = [0.0]
    window = SlidingSecond(3, clock=lambda: now[0])
    assert [window.take() for _ in range(4)] == [True, True, True, False]
    now[0] = 0.99
    assert not window.take()
    now[0] = 1.0
    assert window.take() and window.refused == 2
