"""Property-based fuzzing of the two parsers that take hostile text (SDP offers, stream URLs), and the offers
that once crashed the server, kept as regression fixtures."""

import ipaddress
from pathlib import Path

import httpx
import pytest
from fastapi import HTTPException
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from app.media.peer import OfferError, check_offer
from app.server.ingest_policy import IngestPolicy, SourceRefused
from app.server.routes.streams import check_source
from tests.server.harness import RunningServer, server_settings, upload
from tests.server.test_bad_input import real_offer

FIXTURES = Path(__file__).parent / "fixtures" / "offers"
OFFER = real_offer()
LINES = OFFER.split("\r\n")
FUZZ = settings(max_examples=300, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def _no_dns(host: str, port: int) -> list[str]:
    raise OSError("names are not resolved while fuzzing")  # the parsing and the address rules are under test


def _mutated_offers() -> st.SearchStrategy[str]:
    line = st.sampled_from(LINES)
    junk = st.text(alphabet="=:/ \t0123456789abcdefxyzv-_.;,\x00\x7f\u00e9", max_size=60)
    edited = st.lists(st.one_of(line, junk, line.map(lambda text: text[: len(text) // 2])), max_size=60)
    return st.one_of(
        edited.map("\r\n".join),
        st.permutations(LINES[1:]).map(lambda rest: "\r\n".join([LINES[0], *rest])),
        st.integers(0, len(OFFER)).map(lambda n: OFFER[:n]),
        st.text(max_size=300).map(lambda text: "v=0\r\n" + text),
    )


@FUZZ
@given(text=_mutated_offers())
def test_offer_checking_refuses_with_offer_error_only(text: str) -> None:
    try:
        check_offer(text)
    except OfferError as exc:
        assert str(exc) and " at 0x" not in str(exc)


def _urls() -> st.SearchStrategy[str]:
    host = st.one_of(
        st.sampled_from(["127.0.0.1", "[::1]", "169.254.169.254", "10.0.0.5", "192.168.1.2", "8.8.8.8", "0.0.0.0"]),
        st.sampled_from(["[::ffff:127.0.0.1]", "[fe80::1%25eth0]", "224.0.0.1", "cam.lan", "localhost"]),
        st.text(alphabet="abcdefxyz0123456789.-_:[]%@", max_size=40),
    )
    userinfo = st.sampled_from(["", "admin:s3cret@", "user@", ":@", "a:b:c@"])
    port = st.sampled_from(["", ":554", ":0", ":99999", ":8554", ":-1", ":x"])
    path = st.text(alphabet="/abc?=&#%.", max_size=20)
    scheme = st.sampled_from(["rtsp://", "rtsps://", "RTSP://", "http://", "file://", "", "rtsp:"])
    return st.builds(lambda *parts: "".join(parts), scheme, userinfo, host, port, path)


@pytest.mark.slow
@FUZZ
@given(url=_urls())
def test_stream_urls_are_accepted_only_at_allowed_addresses_and_never_crash(url: str, tmp_path: Path) -> None:
    settings_ = server_settings(tmp_path)
    policy = IngestPolicy(own_ports=frozenset({8554}), resolver=_no_dns)
    try:
        source = check_source(url, settings_)
        checked = policy.check(source)
    except HTTPException as exc:
        assert exc.status_code == 422
        return
    except SourceRefused as exc:
        assert "s3cret" not in str(exc)
        return
    assert "s3cret" not in checked.display_url
    assert policy.refusal(ipaddress.ip_address(checked.address), 554) is None


@pytest.fixture(scope="module")
def identity(server: RunningServer, tom_png: bytes) -> str:
    return str(upload(server.base_url, tom_png, "tom.png").json()["id"])


@pytest.mark.parametrize("fixture", sorted(FIXTURES.glob("*.sdp")), ids=lambda p: p.stem)
def test_offers_that_once_crashed_get_a_4xx(server: RunningServer, identity: str, fixture: Path) -> None:
    response = httpx.post(
        f"{server.base_url}/v1/sessions?identity={identity}",
        content=fixture.read_bytes(),
        headers={"Content-Type": "application/sdp"},
        timeout=30,
    )
    assert 400 <= response.status_code < 500, response.text
