"""Where ingest may connect: the destination policy (`app.destination_policy`) with ingest's defaults, and the
RTSP redirect refusal.

The policy is the one every connection the server makes on a user's word goes through (pushes too): the host
is resolved once, every address must be allowed, and the source is opened at the checked address. Ingest's
defaults: private ranges are allowed (LAN cameras live there) unless SWAPCAST_INGEST_ALLOW_PRIVATE turns them
off, and SWAPCAST_INGEST_ALLOWED_NETWORKS, when set, is the complete list of networks a source may be in. An
rtsp:// source is asked once for its description before ingest starts, and refused when it answers with a
redirect (FFmpeg would follow it anywhere).

Errors from a source are reported to its owner as coarse classes only (`coarse_error`), so a stream's
`last_error` cannot be used to tell open, closed and non-RTSP ports apart.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from app.destination_policy import (
    CheckedDestination,
    DestinationPolicy,
    DestinationRefused,
    HostUnresolved,
    IpAddress,
    IpNetwork,
    is_local_address,
    networks,
    redact_credentials,
    valid_host_name,
)

__all__ = [
    "CheckedSource",
    "HostUnresolved",
    "IngestPolicy",
    "IpAddress",
    "IpNetwork",
    "SourceRefused",
    "coarse_error",
    "is_local_address",
    "redact_credentials",
    "refuse_redirects",
    "valid_host_name",
]

DEFAULT_RTSP_PORT = 554
SourceRefused = DestinationRefused  # a source the policy does not allow; answered with 422 and the reason
CheckedSource = CheckedDestination


@dataclass
class IngestPolicy(DestinationPolicy):
    @classmethod
    def from_settings(
        cls,
        networks_: Iterable[str],
        allow_private: bool,
        own_ports: Iterable[int],
        extra_networks: Iterable[str] = (),
    ) -> IngestPolicy:
        return cls(
            allowed_networks=networks(networks_),
            allow_private=allow_private,
            own_ports=frozenset(p for p in own_ports if p),
            extra_networks=networks(extra_networks),
        )

    def check_and_probe(self, url: str) -> CheckedSource:
        """`check`, then `refuse_redirects` at the checked address: what must hold each time ingest opens `url`.
        Blocks (name lookup, one RTSP request): call it off the event loop."""
        checked = self.check(url)
        refuse_redirects(checked)
        return checked


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
