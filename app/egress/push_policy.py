"""Where a push may go, and how its child process gets there.

When a push is added (`PushPolicy.check`, answered 422 with the reason): an RTMP/RTMPS, SRT caller or WHIP
destination's host must pass the server's destination policy (`app.destination_policy`), which for pushes
refuses private ranges too unless SWAPCAST_DESTINATION_ALLOWED_NETWORKS names them; an SRT listener binds the
server's own host (SWAPCAST_HOST), needs a passphrase, and listens on a port from SWAPCAST_PUSH_LISTENER_PORTS.

Each attempt, in the push's child process (`route`), resolves and checks the host again and connects to the
checked address, so a name that resolves elsewhere later (DNS rebinding) is refused then:
- plain RTMP and SRT callers open the address itself (RTMP's tcUrl then names the address, not the host);
- WHIP (HTTP or HTTPS) and RTMPS go through `OneHostTunnel`, which keeps the name for the HTTP Host header,
  TLS's server name and certificate check, reaches only the checked address, and refuses every other host,
  so a redirect never takes the WHIP Bearer token elsewhere.
"""

from __future__ import annotations

import dataclasses
import urllib.parse
from dataclasses import dataclass
from typing import Any

from app.destination_policy import DestinationPolicy, DestinationRefused, literal_address
from app.egress.push_destination import Destination
from app.egress.push_tunnel import OneHostTunnel

LISTENER_PORTS_SETTING = "SWAPCAST_PUSH_LISTENER_PORTS"


def parse_port_range(text: str) -> tuple[int, int]:
    """`FIRST-LAST` (or one port) as (first, last); ValueError when it is not a range of ports."""
    first, _, last = text.strip().partition("-")
    try:
        low, high = int(first), int(last or first)
    except ValueError:
        low, high = 0, -1
    if not 1 <= low <= high <= 65535:
        raise ValueError(f"{text!r} is not a range of ports such as 10000-10019")
    return low, high


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


@dataclass(frozen=True)
class PushPolicy:
    destinations: DestinationPolicy
    listener_host: str  # the server's bind host: where an SRT listener push listens
    listener_ports: tuple[int, int]

    def check(self, destination: Destination) -> Destination:
        """The destination to keep (an SRT listener's URL names the host it binds), or `DestinationRefused`
        with the reason. A caller's host name is resolved: blocks."""
        if destination.kind == "srt" and destination.mode == "listener":
            return self._listener(destination)
        self.destinations.check(destination.url)
        return destination

    def _listener(self, destination: Destination) -> Destination:
        parts = urllib.parse.urlsplit(destination.url)
        host = parts.hostname or ""
        if host and not _same_address(host, self.listener_host):
            raise DestinationRefused(
                f"an SRT listener push listens on this server's host ({self.listener_host}): give srt://:PORT"
            )
        if not destination.passphrase:
            raise DestinationRefused("an SRT listener push needs a `passphrase`: anyone could read it otherwise")
        low, high = self.listener_ports
        port = parts.port or 0
        if not low <= port <= high or port in self.destinations.own_ports:
            raise DestinationRefused(
                f"an SRT listener push listens on a port from {low}-{high} ({LISTENER_PORTS_SETTING})"
            )
        return self.listening(destination)

    def listening(self, destination: Destination) -> Destination:
        """An SRT listener `destination` bound to the server's host, whatever host its URL named."""
        port = urllib.parse.urlsplit(destination.url).port
        return dataclasses.replace(destination, url=f"srt://{_url_host(self.listener_host)}:{port}")

    def to_json(self) -> dict[str, Any]:
        return {
            "destinations": self.destinations.to_json(),
            "listener_host": self.listener_host,
            "listener_ports": list(self.listener_ports),
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> PushPolicy:
        low, high = raw["listener_ports"]
        return cls(DestinationPolicy.from_json(raw["destinations"]), str(raw["listener_host"]), (int(low), int(high)))


def _same_address(a: str, b: str) -> bool:
    left, right = literal_address(a), literal_address(b)
    if left is not None and right is not None:
        return left == right
    return a.rstrip(".").lower() == b.rstrip(".").lower()


@dataclass
class Route:
    destination: Destination  # what the sink opens
    tunnel: OneHostTunnel | None = None  # set `http_proxy` to its URL while the sink runs

    def close(self) -> None:
        if self.tunnel is not None:
            self.tunnel.close()


def route(policy: PushPolicy, destination: Destination) -> Route:
    """How this attempt reaches `destination`: checked now, at the address checked (blocks on the lookup)."""
    if destination.kind == "srt" and destination.mode == "listener":
        return Route(policy.check(destination))  # a stored one too: the server's host, a passphrase, the ports
    checked = policy.destinations.check(destination.url)
    scheme = urllib.parse.urlsplit(destination.url).scheme.lower()
    if scheme in ("rtmp", "srt"):
        return Route(dataclasses.replace(destination, url=checked.connect_url))
    return Route(destination, OneHostTunnel(checked.host, checked.port, checked.address))
