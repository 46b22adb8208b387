"""Where the server may connect on a user's word: one policy against server-side request forgery for RTSP ingest
sources and every push (RTMP/RTMPS, SRT caller, WHIP).

A URL names a host the server will connect to, so a client could aim the server at its own admin ports, at the
cloud metadata address (169.254.169.254) or at anything else only the server can reach. The policy: the host
must be a valid name or address (the legacy IPv4 forms `127.1` and `0x7f000001` are read as the addresses they
are, and `localhost` names as loopback, without asking a resolver); it is resolved once, every address it
resolves to must be allowed, and the caller connects to the checked address (so a second lookup cannot answer
differently). Refused by default: loopback, link-local, multicast, unspecified, reserved and broadcast
addresses, private ranges where `allow_private` is off, and this server's own ports on its own addresses.

Two lists relax or tighten it: `extra_networks` (SWAPCAST_DESTINATION_ALLOWED_NETWORKS) are allowed although the
rules refuse them (a LAN relay or camera, a test server on loopback), and `allowed_networks`, when set, is the
complete list of networks a connection may reach (ingest's SWAPCAST_INGEST_ALLOWED_NETWORKS). The own-ports
rule holds whatever the lists say.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import SplitResult, urlsplit, urlunsplit

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
# inet_aton's forms: 1-4 parts, each decimal, octal (leading 0) or hex (0x): `127.1`, `0x7f000001`, `2130706433`.
_LEGACY_IPV4 = re.compile(r"(?:0x[0-9a-f]*|[0-9]+)(?:\.(?:0x[0-9a-f]*|[0-9]+)){0,3}", re.IGNORECASE)
_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]*@")
DEFAULT_PORTS = {"rtsp": 554, "rtsps": 322, "rtmp": 1935, "rtmps": 443, "http": 80, "https": 443}
_BROADCAST = ipaddress.IPv4Address("255.255.255.255")

Resolver = Callable[[str, int], list[str]]


class DestinationRefused(Exception):
    """A connection the policy does not allow; answered with 422 and the reason."""


class HostUnresolved(DestinationRefused):
    """The host name does not resolve (now): refused at creation, retried on a reconnect."""


@dataclass(frozen=True)
class CheckedDestination:
    connect_url: str  # the URL with its host replaced by the checked address: what a plain-TCP client opens
    display_url: str  # the URL without credentials: what responses and logs show
    address: str  # the checked address
    host: str = ""  # the host as given (a TLS client's server name)
    port: int = 0


def redact_credentials(url: str) -> str:
    """`url` with any user:password@ removed: rtsp://admin:s3cret@cam/x becomes rtsp://***@cam/x."""
    return _CREDENTIALS.sub("***@", url)


def valid_host_name(host: str) -> bool:
    if len(host) > 253 or not host:
        return False
    return all(_LABEL.fullmatch(label) for label in host.rstrip(".").split("."))


def literal_address(host: str) -> IpAddress | None:
    """The address `host` spells, in any form a C resolver reads as one (`127.1`, `0x7f000001`), else None."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    if _LEGACY_IPV4.fullmatch(host):
        try:
            return ipaddress.IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def is_localhost_name(host: str) -> bool:
    """`localhost` and names under it are loopback whatever a resolver says (RFC 6761)."""
    name = host.rstrip(".").lower()
    return name == "localhost" or name.endswith(".localhost")


def _system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def is_local_address(address: str) -> bool:
    """True when this machine owns `address` (a socket can bind to it)."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError:
            return False
    return True


def networks(values: Iterable[str]) -> list[IpNetwork]:
    return [ipaddress.ip_network(value, strict=False) for value in values]


@dataclass
class DestinationPolicy:
    allowed_networks: list[IpNetwork] = field(default_factory=list)  # when set: nothing outside them
    allow_private: bool = True
    own_ports: frozenset[int] = frozenset()
    resolver: Resolver = _system_resolver
    extra_networks: list[IpNetwork] = field(default_factory=list)  # allowed although the rules refuse them
    label: str = "source_url"  # how refusals name the URL
    default_port: int = 554  # a URL without a port whose scheme has no usual one

    def check(self, url: str) -> CheckedDestination:
        """The destination to connect to, or `DestinationRefused` with the reason. May resolve a name: blocks."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower()) or self.default_port
        literal = literal_address(host)
        if literal is None and not valid_host_name(host):
            raise DestinationRefused(f"{self.label} has an invalid host name")
        try:
            if literal is not None:
                addresses = [str(literal)]
            elif is_localhost_name(host):
                addresses = ["127.0.0.1"]
            else:
                addresses = self.resolver(host, port)
        except (OSError, UnicodeError):
            raise HostUnresolved(f"{self.label}'s host does not resolve") from None
        if not addresses:
            raise HostUnresolved(f"{self.label}'s host does not resolve")
        for address in addresses:
            reason = self.refusal(ipaddress.ip_address(address.split("%", 1)[0]), port)
            if reason is not None:
                raise DestinationRefused(f"{self.label} is not allowed: {reason}")
        chosen = addresses[0]
        return CheckedDestination(_with_host(parts, chosen), redact_credentials(url), chosen, host, port)

    def refusal(self, address: IpAddress, port: int) -> str | None:
        """Why a connection to `address:port` is refused, or None when it is allowed."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if port in self.own_ports and (address.is_loopback or address.is_unspecified or is_local_address(str(address))):
            return "it is this server's own port"
        if any(address in network for network in self.extra_networks):
            return None
        if self.allowed_networks:
            if any(address in network for network in self.allowed_networks):
                return None
            return "the address is outside the networks ingest may reach (SWAPCAST_INGEST_ALLOWED_NETWORKS)"
        if address.is_loopback:
            return "loopback addresses are refused"
        if address.is_link_local:
            return "link-local addresses (such as 169.254.169.254) are refused"
        if address.is_multicast:
            return "multicast addresses are refused"
        if address.is_unspecified:
            return "the unspecified address is refused"
        if address.is_reserved or (isinstance(address, ipaddress.IPv4Address) and address == _BROADCAST):
            return "reserved addresses are refused"
        if not address.is_global and not self.allow_private:  # private ranges, shared (CGNAT), documentation
            return "private addresses are refused (allow a network in SWAPCAST_DESTINATION_ALLOWED_NETWORKS)"
        return None

    def to_json(self) -> dict[str, Any]:
        """What a child process needs to apply the same policy (no resolver: it uses the system's)."""
        return {
            "allowed_networks": [str(n) for n in self.allowed_networks],
            "extra_networks": [str(n) for n in self.extra_networks],
            "allow_private": self.allow_private,
            "own_ports": sorted(self.own_ports),
            "label": self.label,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> DestinationPolicy:
        return cls(
            allowed_networks=networks(raw.get("allowed_networks", [])),
            extra_networks=networks(raw.get("extra_networks", [])),
            allow_private=bool(raw.get("allow_private", False)),
            own_ports=frozenset(int(p) for p in raw.get("own_ports", [])),
            label=str(raw.get("label", "url")),
        )


def _with_host(parts: SplitResult, address: str) -> str:
    host = f"[{address}]" if ":" in address else address
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))
