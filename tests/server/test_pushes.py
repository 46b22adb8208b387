"""A channel's pushes through the API on a keyed server: owner-only, validated, with the stream key kept in the
private push store and never shown, echoed or logged; a push whose destination does not answer retries with
its error (secrets hidden) in its stats; deleting the channel deletes its pushes. (Pushes that reach real
servers: `test_push_delivery.py`.)"""

import logging
import socket
import stat
from collections.abc import Callable, Iterator

import pytest

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.helpers import wait_for
from tests.server.credentials import TwoUsers, two_users_server
from tests.server.harness import LOOPBACK_DESTINATIONS

KEY = "live_123456789_SeCrEtStreamKey"
TOKEN = "whip-bearer-SeCrEt-token-0987"
PASSPHRASE = "srt-SeCrEt-passphrase"


Keyed = TwoUsers


@pytest.fixture(scope="module")
def keyed(
    tmp_path_factory: pytest.TempPathFactory, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> Iterator[Keyed]:
    root = tmp_path_factory.mktemp("pushes")
    with two_users_server(
        root,
        pipeline_factory,
        channel_dir=root / "channels",
        max_pushes_per_channel=3,
        push_retry_s=0.2,
        push_retry_max_s=0.5,
        **LOOPBACK_DESTINATIONS,
    ) as keyed:
        yield keyed


def closed_port() -> int:
    """A local TCP port nothing listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def channel(keyed: Keyed, name: str) -> None:
    made = keyed.call("POST", "/v1/channels", keyed.alice, json={"name": name, "width": 320, "height": 240})
    assert made.status_code == 201, made.text


def test_a_push_is_the_owners_and_its_key_is_never_shown(keyed: Keyed, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="app")
    channel(keyed, "alice-out")
    port = closed_port()
    added = keyed.call(
        "POST", "/v1/channels/alice-out/pushes", keyed.alice, json={"url": f"rtmp://127.0.0.1:{port}/live/{KEY}"}
    )
    assert added.status_code == 201, added.text
    push = added.json()
    assert added.headers["location"] == f"/v1/channels/alice-out/pushes/{push['id']}"
    assert push["url"] == f"rtmp://127.0.0.1:{port}/live/***" and push["kind"] == "rtmp" and push["has_key"]
    whip = keyed.call(
        "POST",
        "/v1/channels/alice-out/pushes",
        keyed.alice,
        json={"url": f"http://127.0.0.1:{port}/whip/endpoint", "key": TOKEN},
    )
    assert whip.status_code == 201 and whip.json()["url"] == f"http://127.0.0.1:{port}/whip/endpoint"

    # Nothing answers: each push retries, its error kept without the key.
    path = f"/v1/channels/alice-out/pushes/{push['id']}"
    assert wait_for(lambda: keyed.call("GET", path, keyed.alice).json()["last_error"] is not None, 30)
    shown = keyed.call("GET", path, keyed.alice).json()
    assert shown["state"] in ("retrying", "connecting") and shown["connects"] == 0, shown
    listed = keyed.call("GET", "/v1/channels/alice-out/pushes", keyed.alice)
    assert [p["id"] for p in listed.json()["pushes"]] == [push["id"], whip.json()["id"]]
    assert "SeCrEt" not in listed.text

    # Only the owner sees or changes them.
    item = f"/pushes/{push['id']}"
    for method, route in (("GET", "/pushes"), ("POST", "/pushes"), ("GET", item), ("DELETE", item)):
        body = {"json": {"url": "rtmp://127.0.0.1/live"}} if method == "POST" else {}
        assert keyed.call(method, f"/v1/channels/alice-out{route}", keyed.bob, **body).status_code == 404, route

    # The key is in the private store, as it must be sent, and nowhere the API or the logs show.
    store = keyed.root / "channels" / "pushes.json"
    assert stat.S_IMODE(store.stat().st_mode) == 0o600
    assert KEY in store.read_text() and TOKEN in store.read_text()
    assert "SeCrEt" not in caplog.text
    assert "SeCrEt" not in keyed.call("GET", "/v1/channels/alice-out", keyed.alice).text

    assert keyed.call("DELETE", path, keyed.alice).status_code == 204
    assert keyed.call("GET", path, keyed.alice).status_code == 404
    assert keyed.call("DELETE", path, keyed.alice).status_code == 404
    assert KEY not in store.read_text()


BAD = [
    ({"url": "ftp://example.com/live"}, "rtmp://"),
    ({"url": "rtmp://example.com"}, "application"),
    ({"url": "rtmp://user:pw@example.com/live"}, "credentials"),
    ({"url": f"rtmp://example.com/live/{KEY}", "key": KEY}, "once"),
    ({"url": "srt://example.com"}, "port"),
    ({"url": "srt://example.com:9000?latency=5"}, "latency"),
    ({"url": "srt://example.com:9000", "passphrase": "short"}, "passphrase"),
    ({"url": "srt://example.com:9000?foo=1"}, "unsupported"),
    ({"url": "rtmp://example.com/live", "mode": "listener"}, "srt://"),
    ({"url": "rtmp://exa mple.com/live"}, "printable"),
    ({"url": "https://example.com/whip", "extra": 1}, "extra"),
]


@pytest.mark.parametrize(("body", "says"), BAD)
def test_a_destination_it_cannot_use_is_refused_with_the_reason(keyed: Keyed, body: dict, says: str) -> None:
    if keyed.call("GET", "/v1/channels/alice-bad", keyed.alice).status_code == 404:
        channel(keyed, "alice-bad")
    refused = keyed.call("POST", "/v1/channels/alice-bad/pushes", keyed.alice, json=body)
    assert refused.status_code == 422, refused.text
    assert says in refused.json()["detail"] and "SeCrEt" not in refused.text


def test_a_channel_has_a_bounded_number_of_pushes_and_they_go_with_it(keyed: Keyed) -> None:
    channel(keyed, "alice-many")
    port = closed_port()
    for n in range(3):
        body = {"url": f"srt://127.0.0.1:{port}?latency={200 + n}", "passphrase": PASSPHRASE}
        added = keyed.call("POST", "/v1/channels/alice-many/pushes", keyed.alice, json=body)
        assert added.status_code == 201, added.text
        assert added.json()["url"] == f"srt://127.0.0.1:{port}?mode=caller&latency={200 + n}&passphrase=***"
    more = {"url": f"rtmp://127.0.0.1:{port}/live"}
    refused = keyed.call("POST", "/v1/channels/alice-many/pushes", keyed.alice, json=more)
    assert refused.status_code == 409 and "most" in refused.json()["detail"]
    store = keyed.root / "channels" / "pushes.json"
    assert store.read_text().count(PASSPHRASE) == 3
    assert keyed.call("DELETE", "/v1/channels/alice-many", keyed.alice).status_code == 204
    assert PASSPHRASE not in store.read_text()
    channel(keyed, "alice-many")  # the name again: none of the old pushes come back
    assert keyed.call("GET", "/v1/channels/alice-many/pushes", keyed.alice).json()["pushes"] == []
