"""The pushes' destination policy from the server's settings (ingest's is `app.server.ingest_policy`)."""

from __future__ import annotations

from collections.abc import Iterable

from app.destination_policy import DestinationPolicy, networks
from app.egress.push_policy import PushPolicy, parse_port_range
from app.server.settings import ServerSettings


def push_policy(settings: ServerSettings, own_ports: Iterable[int]) -> PushPolicy:
    """Where pushes may go: public addresses and the networks SWAPCAST_DESTINATION_ALLOWED_NETWORKS names, never
    this server's own ports; SRT listener pushes on the server's host and SWAPCAST_PUSH_LISTENER_PORTS."""
    policy = DestinationPolicy(
        allow_private=False,
        own_ports=frozenset(p for p in own_ports if p),
        extra_networks=networks(settings.destination_allowed_networks),
        label="url",
    )
    return PushPolicy(policy, settings.host, parse_port_range(settings.push_listener_ports))
