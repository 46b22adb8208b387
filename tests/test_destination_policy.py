"""The destination policy as a pure function: every spelling of loopback, link-local and private addresses is
refused for pushes (no name lookup for the literal ones), named networks are let through, the server's own ports
never, and a name is checked each time it is resolved (a second answer elsewhere is refused)."""

import ipaddress

import pytest

from app.destination_policy import DestinationPolicy, DestinationRefused, networks
from app.egress.push_destination import Destination
from app.egress.push_policy import PushPolicy, route
from app.server.ingest_policy import IngestPolicy

OWN_PORTS = frozenset({8000, 8554})


def no_lookup(host: str, port: int) -> list[str]:
    raise AssertionError(f"{host} was looked up: a literal address must be read as one")


PUSHES = DestinationPolicy(allow_private=False, own_ports=OWN_PORTS, resolver=no_lookup, label="url")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("rtmp://127.0.0.1/live", "loopback"),
        ("rtmp://[::1]/live", "loopback"),
        ("rtmp://0.0.0.0/live", "unspecified"),
        ("http://localhost./whip", "loopback"),
        ("http://LocalHost/whip", "loopback"),
        ("http://api.localhost/whip", "loopback"),
        ("rtmp://0x7f000001/live", "loopback"),
        ("rtmp://127.1/live", "loopback"),
        ("rtmp://2130706433/live", "loopback"),
        ("rtmp://0177.0.0.1/live", "loopback"),
        ("http://[::ffff:127.0.0.1]/whip", "loopback"),
        ("http://169.254.169.254/latest/meta-data", "link-local"),
        ("http://0xa9fea9fe/latest/meta-data", "link-local"),
        ("http://[fe80::1]/whip", "link-local"),
        ("rtmp://10.0.0.5/live", "private"),
        ("rtmp://172.16.0.1/live", "private"),
        ("rtmp://192.168.1.20/live", "private"),
        ("rtmp://100.64.0.1/live", "private"),
        ("srt://[fc00::1]:9000", "private"),
        ("rtmp://224.0.0.1/live", "multicast"),
        ("rtmp://203.0.113.9:8000/live", "private"),
        ("rtmp://bad_host/live", "invalid host name"),
    ],
)
def test_pushes_to_every_spelling_of_an_internal_address_are_refused_without_a_lookup(url: str, reason: str) -> None:
    with pytest.raises(DestinationRefused, match=reason):
        PUSHES.check(url)


def test_the_servers_own_ports_are_refused_even_on_an_allowed_network() -> None:
    loopback = DestinationPolicy(
        allow_private=False, own_ports=OWN_PORTS, extra_networks=networks(["127.0.0.0/8"]), resolver=no_lookup
    )
    assert loopback.check("rtmp://127.0.0.1:1935/live").address == "127.0.0.1"
    for url in ("rtmp://127.0.0.1:8000/live", "http://localhost:8554/x", "rtmp://0.0.0.0:8000/live"):
        with pytest.raises(DestinationRefused, match="own port"):
            loopback.check(url)


def test_a_named_private_network_is_allowed_and_no_other() -> None:
    lan = DestinationPolicy(allow_private=False, extra_networks=networks(["192.168.1.0/24"]), resolver=no_lookup)
    assert lan.check("rtmp://192.168.1.20/live").connect_url == "rtmp://192.168.1.20/live"
    with pytest.raises(DestinationRefused, match="private"):
        lan.check("rtmp://192.168.2.1/live")
    assert lan.refusal(ipaddress.ip_address("8.8.8.8"), 1935) is None  # the public internet: a platform


def test_a_name_is_checked_at_each_lookup_and_opened_at_the_address_checked() -> None:
    """DNS rebinding: the name passes when the push is added, then resolves to the metadata address when the
    push's child connects: that attempt is refused; an allowed answer is opened at the address itself."""
    answers = iter([["8.8.8.8"], ["8.8.4.4"], ["169.254.169.254"]])
    policy = PushPolicy(
        DestinationPolicy(allow_private=False, resolver=lambda host, port: next(answers), label="url"),
        "127.0.0.1",
        (10000, 10019),
    )
    destination = Destination.parse("rtmp://ingest.example/live", key="k3y")
    assert policy.check(destination) is destination
    first = route(policy, destination)
    assert first.destination.target == "rtmp://8.8.4.4/live/k3y" and first.tunnel is None
    with pytest.raises(DestinationRefused, match="link-local"):
        route(policy, destination)


def test_whip_and_rtmps_keep_their_name_and_go_through_a_tunnel_to_the_checked_address() -> None:
    policy = PushPolicy(
        DestinationPolicy(allow_private=False, resolver=lambda host, port: ["8.8.8.8"]), "127.0.0.1", (1, 2)
    )
    for url, port in (("https://whip.example/whip", 443), ("rtmps://live.example/app", 443)):
        way = route(policy, Destination.parse(url, key="k3y"))
        try:
            assert way.destination.url == url and way.tunnel is not None
            assert (way.tunnel.host, way.tunnel.port, way.tunnel.address) == (url.split("/")[2], port, "8.8.8.8")
        finally:
            way.close()


@pytest.mark.parametrize(
    ("url", "passphrase", "reason"),
    [
        ("srt://:10005", None, "passphrase"),
        ("srt://:9000", "a-good-passphrase", "10000-10019"),
        ("srt://:8000", "a-good-passphrase", "10000-10019"),
        ("srt://0.0.0.0:10005", "a-good-passphrase", "this server's host"),
        ("srt://192.168.1.20:10005", "a-good-passphrase", "this server's host"),
    ],
)
def test_a_listener_push_binds_the_servers_host_with_a_passphrase_on_a_configured_port(
    url: str, passphrase: str | None, reason: str
) -> None:
    policy = PushPolicy(PUSHES, "127.0.0.1", (10000, 10019))
    with pytest.raises(DestinationRefused, match=reason):
        policy.check(Destination.parse(url, mode="listener", passphrase=passphrase))
    kept = policy.check(Destination.parse("srt://:10005", mode="listener", passphrase="a-good-passphrase"))
    assert kept.url == "srt://127.0.0.1:10005" and kept.target.startswith("srt://127.0.0.1:10005?mode=listener")


def test_ingest_reaches_the_networks_the_destination_setting_names_and_keeps_its_lan_default() -> None:
    ingest = IngestPolicy.from_settings([], allow_private=True, own_ports=(8554,), extra_networks=["127.0.0.0/8"])
    ingest.resolver = no_lookup
    assert ingest.check("rtsp://127.0.0.1:9/x").address == "127.0.0.1"
    assert ingest.check("rtsp://192.168.1.20/cam").address == "192.168.1.20"  # LAN cameras, as before
    with pytest.raises(DestinationRefused, match="own port"):
        ingest.check("rtsp://127.0.0.1:8554/x")
    with pytest.raises(DestinationRefused, match="link-local"):
        ingest.check("rtsp://169.254.169.254/x")
