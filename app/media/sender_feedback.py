"""The client's feedback on a session's return stream, passed to its encoder's loss-based rate control.

aiortc's sender (1.16) reads the client's receiver reports only for its round-trip time and stats, and answers
NACKs from a 128-packet history without counting what it resent. `tap_sender` wraps, on one sender, the method
its transport hands every RTCP packet to: each receiver report's fraction lost for our stream, and the bytes
each NACK will have resent (looked up in that history, as the sender does), go to the encoder
(app.media.encoder's `report_loss` / `report_retransmitted`, which with loss control off ignore them); then
aiortc handles the packet as before. The encoder is made on the first frame, so reports before it are dropped.
Where app.media.sender_recovery serves the NACKs instead, it reports what it did resend (`resent`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiortc.rtp import RTCP_RTPFB_NACK, RTP_HISTORY_SIZE, RtcpRrPacket, RtcpRtpfbPacket, RtcpSrPacket

log = logging.getLogger(__name__)

_ENCODER_ATTRIBUTE = "_RTCRtpSender__encoder"  # where aiortc's sender keeps its encoder
_HISTORY_ATTRIBUTE = "_RTCRtpSender__rtp_history"  # and the packets it may resend
RTP_HEADER_BYTES = 12
RTX_HEADER_BYTES = 2  # the original sequence number RTX prefixes


class SenderTap:
    """The encoder behind one tapped sender, for the session's stats."""

    def __init__(self, sender: Any) -> None:
        self._sender = sender
        # Whether a NACK's bytes are counted here (from aiortc's history); off where the sender's retransmissions
        # are app.media.sender_recovery's, which reports what it did resend through `resent`.
        self.count_nacks = True

    def encoder(self) -> Any:
        return getattr(self._sender, _ENCODER_ATTRIBUTE, None)

    def rate_stats(self) -> dict[str, Any] | None:
        """The encoder's return rate (app.media.encoder's `rate_stats`); None before the first frame."""
        encoder = self.encoder()
        stats = getattr(encoder, "rate_stats", None)
        return stats() if callable(stats) else None

    def feed(self, packet: Any, now: float) -> None:
        encoder = self.encoder()
        if encoder is None or not hasattr(encoder, "report_loss"):
            return
        if isinstance(packet, (RtcpRrPacket, RtcpSrPacket)):
            for report in packet.reports:
                if report.ssrc == self._sender._ssrc:
                    encoder.report_loss(report.fraction_lost / 256.0, now)
        elif isinstance(packet, RtcpRtpfbPacket) and packet.fmt == RTCP_RTPFB_NACK and self.count_nacks:
            resent = self._resent_bytes(packet.lost)
            if resent:
                encoder.report_retransmitted(resent, now)

    def resent(self, nbytes: int, now: float) -> None:
        """Bytes retransmitted: taken off the media's share of the rate (nothing before the first frame)."""
        encoder = self.encoder()
        if encoder is not None and hasattr(encoder, "report_retransmitted"):
            encoder.report_retransmitted(nbytes, now)

    def _resent_bytes(self, lost: list[int]) -> int:
        history = getattr(self._sender, _HISTORY_ATTRIBUTE, None)
        if not isinstance(history, dict):
            return 0
        total = 0
        for seq in lost:
            packet = history.get(seq % RTP_HISTORY_SIZE)
            if packet is not None and packet.sequence_number == seq:
                total += RTP_HEADER_BYTES + RTX_HEADER_BYTES + len(packet.payload)
        return total


def tap_sender(sender: Any) -> SenderTap | None:
    """Pass `sender`'s RTCP feedback to its encoder before aiortc handles it; None (with a warning, the sender
    left as aiortc made it) where this aiortc's sender has no such method."""
    handle: Callable[[Any], Awaitable[None]] | None = getattr(sender, "_handle_rtcp_packet", None)
    if handle is None:
        log.warning("this aiortc's sender has no RTCP handler where expected; the return follows REMB alone")
        return None
    tap = SenderTap(sender)

    async def handle_rtcp_packet(packet: Any) -> None:
        try:
            tap.feed(packet, time.monotonic())
        except Exception:  # feedback for the rate is an extra: aiortc's own handling must still run
            log.exception("reading the client's RTCP feedback failed")
        await handle(packet)

    setattr(sender, "_handle_rtcp_packet", handle_rtcp_packet)  # noqa: B010 (an instance's method is replaced)
    return tap
