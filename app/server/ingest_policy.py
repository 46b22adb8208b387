"""Where ingest may connect: a host policy against server-side request forgery.

A stream source names a host the server will connect to, so a client could aim the server at its own admin
ports, at the cloud metadata address (169.254.169.254) or at anything else only the server can reach. The policy:
the host must be a valid name or address; it is resolved once, every address it resolves to must be allowed, and
the source is opened at the checked address (so a second lookup cannot answer differently). Refused by default:
loopback, link-local, multicast, unspecified, reserved and broadcast addresses, and this server's own ports on
its own addresses. Private ranges are allowed (LAN cameras live there) unless turned off. `allowed_networks`,
when set, is the complete list of networks a source may be in, and may include loopback (tests, a camera proxy
on the same machine). An rtsp:// source is asked once for its description before ingest starts, and refused when
it answers with a redirect (FFmpeg would follow it anywhere).

Errors from a source are reported to its owner as coarse classes only (`coarse_error`), so a stream's
`last_error` cannot be used to tell open, closed and non-RTSP ports apart.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from urllib.parse import SplitResult, urlsplit, urlunsplit

IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]*@")
DEFAULT_RTSP_PORT = 554
RESOLVE_TIMEOUT_S = 5.0

Resolver = Callable[[str, int], list[str]]


class SourceRefused(Exception):
    """A source the policy does not allow; answered with 422 and the reason."""


class HostUnresolved(SourceRefused):
    """The source's host name does not resolve (now): refused at creation, retried on a reconnect."""


@dataclass(frozen=True)
class CheckedSource:
    connect_url: str  # the URL with its host replaced by the checked address: what ingest opens
    display_url: str  # the URL without credentials: what responses and logs show
    address: str


def redact_credentials(url: str) -> str:
    """`url` with any user:password@ removed: rtsp://admin:s3cret@cam/x becomes rtsp://***@cam/x."""
    return _CREDENTIALS.sub("***@", url)


def valid_host_name(host: str) -> bool:
    if len(host) > 253 or not host:
        return False
    return all(_LABEL.match(label) for label in host.rstrip(".").split("."))


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


@dataclass
class IngestPolicy:
    allowed_networks: list[IpNetwork] = field(default_factory=list)
    allow_private: bool = True
    own_ports: frozenset[int] = frozenset()
    resolver: Resolver = _system_resolver

    @classmethod
    def from_settings(cls, networks: Iterable[str], allow_private: bool, own_ports: Iterable[int]) -> IngestPolicy:
        return cls(
            allowed_networks=[ipaddress.ip_network(n, strict=False) for n in networks],
            allow_private=allow_private,
            own_ports=frozenset(p for p in own_ports if p),
        )

    def check(self, url: str) -> CheckedSource:
        """The source to open, or `SourceRefused` with the reason."""
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port or DEFAULT_RTSP_PORT
        try:
            literal: IpAddress | None = ipaddress.ip_address(host)
        except ValueError:
            literal = None
        if literal is None and not valid_host_name(host):
            raise SourceRefused("source_url has an invalid host name")
        try:
            addresses = [host] if literal is not None else self.resolver(host, port)
        except (OSError, UnicodeError):
            raise HostUnresolved("source_url's host does not resolve") from None
        if not addresses:
            raise HostUnresolved("source_url's host does not resolve")
        for address in addresses:
            reason = self.refusal(ipaddress.ip_address(address.split("%", 1)[0]), port)
            if reason is not None:
                raise SourceRefused(f"source_url is not allowed: {reason}")
        chosen = addresses[0]
        return CheckedSource(_with_host(parts, chosen), redact_credentials(url), chosen)

    def check_and_probe(self, url: str) -> CheckedSource:
        """`check`, then `refuse_redirects` at the checked address: what must hold each time ingest opens `url`.
        Blocks (name lookup, one RTSP request): call it off the event loop."""
        checked = self.check(url)
        refuse_redirects(checked)
        return checked

    def refusal(self, address: IpAddress, port: int) -> str | None:
        """Why a connection to `address:port` is refused, or None when it is allowed."""
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        if port in self.own_ports and (address.is_loopback or is_local_address(str(address))):
            return "it is this server's own port"
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
        if address.is_private and not address.is_global and not self.allow_private:
            return "private addresses are refused (SWAPCAST_INGEST_ALLOW_PRIVATE)"
        return None


_BROADCAST = ipaddress.IPv4Address("255.255.255.255")


def _with_host(parts: SplitResult, address: str) -> str:
    host = f"[{address}]" if ":" in address else address
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = (userinfo + "@" if userinfo else "") + host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def coarse_error(error: str | None) -> str | None:
    """A source's error as one of a few classes: enough for its owner to act on, too little to scan ports with."""
    if error is None:
        return None
    text = error.lower()
    if "host policy" in text:
        return "source refused by the host policy (it redirects, or reaches an address ingest may not)"
    if "process failed" in text:
        return "processing failed"
    if "gave up" in text:
        return "source unavailable: gave up retrying"
    if "401" in text or "unauthorized" in text or "authoriz" in text:
        return "source refused the credentials"
    if "no video" in text or "no decodable video" in text:
        return "source has no video"
    if "ended" in text:
        return "source ended"
    return "source unavailable"


PROBE_TIMEOUT_S = 3.0
_STATUS_LINE = re.compile(rb"^RTSP/1\.\d (\d{3})")


def _user_agent() -> str:
    """FFmpeg's own User-Agent, so a source cannot answer the probe differently from the ingest that follows."""
    import av

    major, minor, micro = av.library_versions["libavformat"]
    return f"Lavf{major}.{minor}.{micro}"


def refuse_redirects(checked: CheckedSource, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Ask an rtsp:// source for its description once, at the checked address: FFmpeg follows an RTSP redirect
    wherever it points (no option turns that off), so a source that answers 3xx is refused. A source that does
    not answer, or asks for credentials first, is left to ingest, which reports it coarsely."""
    parts = urlsplit(checked.connect_url)
    if parts.scheme.lower() != "rtsp" or not checked.address:
        return
    target = urlunsplit((parts.scheme, parts.netloc.rpartition("@")[2], parts.path, parts.query, ""))
    request = f"DESCRIBE {target} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\nUser-Agent: {_user_agent()}\r\n\r\n"
    try:
        with socket.create_connection((checked.address, parts.port or DEFAULT_RTSP_PORT), timeout=timeout_s) as conn:
            conn.sendall(request.encode("latin-1", "replace"))
            reply = conn.recv(512)
    except (OSError, UnicodeError):
        return
    status = _STATUS_LINE.match(reply)
    if status is not None and status.group(1).startswith(b"3"):
        raise SourceRefused("source_url redirects elsewhere; give the address the camera really serves on")
