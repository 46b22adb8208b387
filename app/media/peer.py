"""The WebRTC peer side every connection of this server goes through, a session's or a WHEP viewer's: the offer's
checks, codec preferences, the answer with its ICE bounded before any check is sent, the address the answer
advertises, and the ICE deadline.

A session's offer sends the camera; a viewer's offer only receives: the checks differ in the video section's
direction only. The ICE deadline is the same for both: a peer that does not complete ICE within it is not
coming, and what it holds (a session slot, a viewer place) frees long before the connect timeout.
"""

from __future__ import annotations

import socket
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

from aiortc import (
    RTCConfiguration,
    RTCIceServer,
    RTCPeerConnection,
    RTCRtpCodecCapability,
    RTCRtpSender,
    RTCSessionDescription,
    sdp,
)

from app.media.advertise import advertise_host_candidates
from app.media.ice_bounds import BoundedIce, IceBounds, ice_connections
from app.media.padded_packets import use_padded_decoders

# Every receiver of this process decodes from padded packets: aiortc's own decoders can read past a frame's end.
use_padded_decoders()

# Remote candidates an offer may list: aioice checks every pair, so 300 of them made the server send 1,722 STUN
# packets to 300 ports of the client's choosing in 20 s. A browser lists a handful per network interface.
MAX_REMOTE_CANDIDATES = 16
ICE_UP = ("connected", "completed")


class OfferError(Exception):
    """The SDP offer cannot be used; the message says why (answered with 400)."""


class MediaUnavailable(Exception):
    """The server has no address to receive media on (answered with 503: nothing the client can fix)."""


class Role(Enum):
    """What the offering peer does with the video: the directions its video section may have."""

    SENDER = ("sendrecv", "sendonly")  # a session's camera
    VIEWER = ("recvonly",)  # a WHEP viewer pulls the output and sends nothing

    @property
    def directions(self) -> tuple[str, ...]:
        return self.value


@dataclass(frozen=True)
class PeerConfig:
    ice_servers: tuple[str, ...] = ()
    max_remote_candidates: int = MAX_REMOTE_CANDIDATES
    # Outgoing STUN requests per second and peer-reflexive candidates per peer (app/media/ice_bounds.py).
    ice_bounds: IceBounds = field(default_factory=IceBounds)
    ice_timeout_s: float = 5.0
    # Behind a one-to-one NAT: the address the answer's host candidates name instead of the bound one.
    advertised_address: str | None = None


def peer_connection(ice_servers: Iterable[str]) -> RTCPeerConnection:
    return RTCPeerConnection(RTCConfiguration(iceServers=[RTCIceServer(url) for url in ice_servers]))


def ice_up(pc: RTCPeerConnection) -> bool:
    return pc.iceConnectionState in ICE_UP


def bindable_host_addresses() -> list[str]:
    """The host addresses aioice would gather from that a UDP socket can bind to."""
    import aioice.ice

    usable = []
    for address in aioice.ice.get_host_addresses(use_ipv4=True, use_ipv6=True):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            try:
                probe.bind((address, 0))
            except OSError:
                continue
        usable.append(address)
    return usable


def use_host_addresses(addresses: Iterable[str]) -> None:
    """Offer only these local addresses as ICE host candidates, process-wide.

    aioice never offers 127.0.0.1; tests and benchmarks that must stay on loopback call this with
    ["127.0.0.1"]."""
    import aioice.ice

    fixed = list(addresses)

    def host_addresses(use_ipv4: bool, use_ipv6: bool) -> list[str]:
        return [a for a in fixed if (":" in a and use_ipv6) or (":" not in a and use_ipv4)]

    aioice.ice.get_host_addresses = host_addresses


def codec_preferences(names: Iterable[str], kind: str = "video") -> list[RTCRtpCodecCapability]:
    """aiortc's codec capabilities of `kind` for these codec names, in this order, plus retransmission for video."""
    capabilities = RTCRtpSender.getCapabilities(kind).codecs
    ordered: list[RTCRtpCodecCapability] = []
    for name in [*names, *(["rtx"] if kind == "video" else [])]:
        mime = f"{kind}/{name}".lower()
        ordered.extend(c for c in capabilities if c.mimeType.lower() == mime)
    return ordered


def check_offer(text: str, max_candidates: int = MAX_REMOTE_CANDIDATES, role: Role = Role.SENDER) -> None:
    """Refuse what aiortc would choke on later or what this server cannot serve, with a reason."""
    if not text.startswith("v=0"):
        raise OfferError("not an SDP offer: it must start with v=0")
    try:
        description = sdp.SessionDescription.parse(text)
    except Exception as exc:  # the parser raises many kinds of error on malformed lines
        raise OfferError(f"malformed SDP: {short(exc)}") from None
    videos = [m for m in description.media if m.kind == "video"]
    if not videos:
        raise OfferError("the offer has no video")
    if len(videos) > 1:
        one = "send one camera" if role is Role.SENDER else "receive one video"
        raise OfferError(f"the offer has more than one video track; {one}")
    for media in description.media:
        if media.kind not in ("audio", "video"):
            raise OfferError(f"media kind {media.kind!r} is not supported")
        if media.ice is None or not media.ice.usernameFragment or not media.ice.password:
            raise OfferError("ICE username fragment or password is missing")
        if media.dtls is None or not media.dtls.fingerprints:
            raise OfferError("DTLS fingerprint is missing")
        if not media.rtcp_mux:
            raise OfferError("RTCP mux is not enabled")
        if media.direction is None:
            raise OfferError(f"the {media.kind} section has no direction (sendrecv, sendonly, ...)")
    if not videos[0].rtp.muxId:
        raise OfferError("the video section has no a=mid")
    if videos[0].direction not in role.directions:
        wanted = " or ".join(role.directions)
        what = "send the camera" if role is Role.SENDER else "a viewer receives"
        raise OfferError(f"the video section is {videos[0].direction}: {what} ({wanted})")
    candidates = sum(len(m.ice_candidates) for m in description.media)
    if candidates > max_candidates:
        raise OfferError(f"the offer lists {candidates} ICE candidates; at most {max_candidates} are accepted")
    # A send-only publisher may list none: WHIP ingest clients (FFmpeg's WHIP muxer, measured) offer no
    # candidates and connect to the answer's, the server learning their address from their checks.
    if candidates == 0 and role is Role.SENDER and videos[0].direction != "sendonly":
        # What a stock Chromium sends from a machine whose only network interface is loopback (measured): it
        # never offers 127.0.0.1 unless started with --allow-loopback-in-peer-connection, and cannot connect.
        # A viewer may list none: a page without camera permission hides its addresses behind mDNS names,
        # and its checks reach the server's candidates, which learns the viewer's address from them.
        raise OfferError(
            "the offer lists no ICE candidates: the browser found no network address to use (on a machine with "
            "only a loopback interface, start Chromium with --allow-loopback-in-peer-connection)"
        )


async def answer_offer(
    pc: RTCPeerConnection, ice: BoundedIce, offer: str, config: PeerConfig, codecs: Iterable[str]
) -> str:
    """Apply a checked offer to `pc` (its transceivers added) and return the answer as the client must see it:
    ICE gathering complete (no trickle), the checks bounded, the advertised address in place."""
    try:
        await pc.setRemoteDescription(RTCSessionDescription(sdp=offer, type="offer"))
    except Exception as exc:  # aiortc raises assorted errors for offers it cannot use
        if "send parameters" in str(exc):
            raise OfferError(f"no video codec in common: this server sends {', '.join(codecs)}") from None
        raise OfferError(f"unusable offer: {short(exc)}") from None
    try:
        await pc.setLocalDescription(await pc.createAnswer())
    except Exception as exc:  # offers that parse but leave aiortc unable to answer
        raise OfferError(f"cannot answer this offer: {short(exc)}") from None
    # Gathered, and the checks start only once this returns to the event loop: bound them now.
    ice.apply(ice_connections(pc))
    local: str = pc.localDescription.sdp
    if "\na=candidate:" not in local:
        if not bindable_host_addresses():
            raise MediaUnavailable("the server has no usable address for media (see SWAPCAST_ICE_HOST_ADDRESSES)")
        raise OfferError("the offer leaves no media section to answer with candidates")
    if config.advertised_address is not None:
        local = advertise_host_candidates(local, config.advertised_address)
    return local


def negotiated_codec(answer: str) -> str | None:
    """The first codec of the video section of an SDP answer (what the server will send)."""
    in_video = False
    first: str | None = None
    for line in answer.splitlines():
        if line.startswith("m="):
            in_video = line.startswith("m=video")
            parts = line.split()
            first = parts[3] if in_video and len(parts) > 3 else None
        elif in_video and first is not None and line.startswith(f"a=rtpmap:{first} "):
            return line.split(" ", 1)[1].split("/")[0]
    return None


def short(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if len(text) <= 200 else text[:197] + "..."
