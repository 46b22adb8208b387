"""Recovery of a session's return stream by its sender alone: every NACK served, and receivers that ask for a
lost packet only once made to ask again.

aiortc's sender (1.16) answers a NACK from the last 128 packets (over RTX where the peer negotiated it) and
nothing more. aiortc's receiver, as a plain client runs it, asks for missing packets (one NACK listing every
packet it still misses) only when a new gap in sequence numbers appears, and its jitter buffer holds every
frame behind a missing packet until the packet comes or 512 newer ones have (5 s at 1 Mbit/s); a keyframe does
not release it. So at 1% loss each way, a lost NACK or a lost retransmission froze the return until the next
loss happened to bring a new NACK (about a second later), or for the buffer's 512 packets when none did:
4.88, 2.34 and 1.28 s in 3 of 7 runs. A receiver's own repeats (a browser's, app.media.recovery's) do not
depend on the sender; this one must not depend on the receiver.

`recover_sender` installs, on one video sender:

- its own history of the last `HISTORY_PACKETS` packets sent, keyed by full sequence number (aiortc's keeps
  128 by sequence number modulo 128, fewer than a receiver may still ask for after a keyframe), from which
  every NACKed packet is resent (over RTX where negotiated), except one resent under `RESEND_GUARD_S` ago
  (a retransmission still on its way);
- probes while the receiver reports loss (a NACK, or loss in a receiver report, in the last `PROBE_WHILE_S`):
  every `PROBE_INTERVAL_S`, at the next frame's first packet, that packet's sequence number is moved up by one
  and the number it skipped is sent, empty, just after it (between two frames, where libwebrtc puts padding).
  The receiver sees a gap, and a receiver that asks only on gaps sends its full list of missing packets at
  once; the empty packet fills the gap a moment later. So a lost request or a lost retransmission is asked
  for again within `PROBE_INTERVAL_S` (and a frame) plus a round trip. A receiver that repeats requests
  itself (a browser) at most asks for the empty packet, which is resent (tens of bytes).

A receiver that did not negotiate NACK cannot be helped by either: while its receiver reports show loss it is
sent a keyframe every `LOSS_KEYFRAME_INTERVAL_S` (the encoder's `keyframes_under_loss`, or, where the sender
only packetizes frames encoded once for many receivers (a WHEP viewer's, app.egress.whep), the hook given to
`recover_sender`, which asks that shared encode), so a loss stays on its screen half a second at most.
Keyframe requests (PLI/FIR) are aiortc's: the next frame is encoded as a keyframe (app.media.encoder limits
how often). What every NACK, probe and keyframe request did is counted
(`SenderRecoveryCounts`). With `enabled` false the sender is left to aiortc and only counted.

Reaches into aiortc's sender: the history dict it writes each packet into just before sending it
(`_RTCRtpSender__rtp_history`; ours keeps it filled as aiortc would), its `_retransmit`, `_handle_rtcp_packet`
and `send` methods, its encoder, and the RTX payload type and header extension map it negotiated.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiortc.rtp import (
    RTCP_PSFB_FIR,
    RTCP_PSFB_PLI,
    RTCP_RTPFB_NACK,
    RTP_HISTORY_SIZE,
    RtcpPsfbPacket,
    RtcpRrPacket,
    RtcpRtpfbPacket,
    RtcpSrPacket,
    RtpPacket,
    wrap_rtx,
)
from aiortc.utils import random16, uint16_add

log = logging.getLogger(__name__)

HISTORY_PACKETS = 1024  # ~10 s at 1 Mbit/s, ~3 s at 3: longer than any receiver waits for a packet
RESEND_GUARD_S = 0.02  # a packet resent this recently is not resent again
PROBE_INTERVAL_S = 0.1  # while loss is reported, a probe this often: a lost request is repeated this soon
PROBE_WHILE_S = 5.0  # probes go on this long after the last sign of loss: through the quiet spells of a lossy link
LOSS_KEYFRAME_INTERVAL_S = 0.5  # a receiver that cannot ask for packets: a keyframe this often while it loses

_HISTORY_ATTRIBUTE = "_RTCRtpSender__rtp_history"  # aiortc writes each packet here before sending it
_RTX_ATTRIBUTE = "_RTCRtpSender__rtx_payload_type"  # None unless the peer negotiated RTX
_EXTENSIONS_ATTRIBUTE = "_RTCRtpSender__rtp_header_extensions_map"
_ENCODER_ATTRIBUTE = "_RTCRtpSender__encoder"  # made on the first frame


@dataclass
class SenderRecoveryCounts:
    nacks: int = 0  # NACK packets received
    nacked: int = 0  # sequence numbers they asked for
    resent: int = 0  # retransmissions sent
    resent_bytes: int = 0
    resend_guarded: int = 0  # asked for again while a retransmission was on its way: not resent
    not_in_history: int = 0  # asked for after leaving the history
    probes: int = 0  # gaps made for a receiver to ask again
    keyframe_requests: int = 0  # PLI and FIR received

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class _Sent:
    __slots__ = ("packet", "resent_at")

    def __init__(self, packet: RtpPacket) -> None:
        self.packet = packet
        self.resent_at: float | None = None


class SenderRecovery:
    """The history, retransmissions and probes of one sender (see the module docstring)."""

    def __init__(
        self,
        sender: Any,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
        on_resent: Callable[[int, float], None] | None = None,
        keyframes_under_loss: Callable[[float | None], None] | None = None,
    ) -> None:
        self._sender = sender
        self._keyframes_under_loss = keyframes_under_loss  # None: the sender's own encoder's
        self.enabled = enabled
        self._clock = clock
        self._on_resent = on_resent  # (bytes, when): retransmissions share the link with the media
        self.counts = SenderRecoveryCounts()
        self._history: OrderedDict[int, _Sent] = OrderedDict()
        self._filler: int | None = None  # the sequence number of the newest probe's empty packet
        self._filler_asked = False  # whether a NACK asked for it yet (the first is its own gap's)
        self._offset = 0  # added to aiortc's sequence numbers: one per probe
        self._last: RtpPacket | None = None
        self._loss_at: float | None = None  # the last sign of loss
        self._probed_at = float("-inf")
        self._rtx_sequence_number = random16()
        self._tasks: set[asyncio.Task[None]] = set()
        self.peer_nacks: bool | None = None  # whether the receiver negotiated NACK; None before the sender starts
        self._encoder_told = False

    # ----------------------------------------------------------------------------- what is sent

    def on_sent(self, packet: RtpPacket) -> None:
        """aiortc is about to send `packet` (its sequence number may still change here)."""
        if not self.enabled:
            return
        if not self._encoder_told:
            self._tell_encoder()
        now = self._clock()
        if self._offset:
            packet.sequence_number = uint16_add(packet.sequence_number, self._offset)
        # Only between frames, as libwebrtc sends padding on a media stream: a browser's H.264 packet buffer
        # finds a frame's start by walking back to a missing packet, so an empty one inside a frame would cut it.
        if self._last is not None and self._last.marker and self._probe_due(now):
            self._probe(packet, self._last, now)
        self._remember(packet)
        self._last = packet

    def negotiated(self, parameters: Any) -> None:
        """The parameters the sender starts with (`RTCRtpSender.send`): whether the receiver asks for packets."""
        codecs = getattr(parameters, "codecs", None) or []
        if codecs:
            feedback = getattr(codecs[0], "rtcpFeedback", None) or []
            self.peer_nacks = any(f.type == "nack" and not f.parameter for f in feedback)

    @property
    def loss_at(self) -> float | None:
        """When the receiver last showed loss (a NACK, a keyframe request or loss in a report); None before."""
        return self._loss_at

    def _tell_encoder(self) -> None:
        """A receiver that cannot ask for lost packets gets frequent keyframes while it reports loss (the
        encoder's `keyframes_under_loss`, app.media.encoder, or the hook given in its place)."""
        setter = self._keyframes_under_loss
        if setter is None:
            encoder = getattr(self._sender, _ENCODER_ATTRIBUTE, None)
            if encoder is None:
                return
            setter = getattr(encoder, "keyframes_under_loss", None)
        if self.peer_nacks is None:
            return
        self._encoder_told = True
        if callable(setter):
            setter(None if self.peer_nacks else LOSS_KEYFRAME_INTERVAL_S)

    def _probe_due(self, now: float) -> bool:
        return (
            self._loss_at is not None
            and now - self._loss_at <= PROBE_WHILE_S
            and now - self._probed_at >= PROBE_INTERVAL_S
        )

    def _probe(self, packet: RtpPacket, previous: RtpPacket, now: float) -> None:
        """Leave a gap before `packet` and fill it with an empty packet sent after it."""
        filler = RtpPacket(
            payload_type=previous.payload_type,
            sequence_number=packet.sequence_number,
            timestamp=previous.timestamp,  # it sits after `previous`, in its frame: a frame gains nothing
            ssrc=previous.ssrc,
        )
        filler.extensions = previous.extensions
        self._offset += 1
        packet.sequence_number = uint16_add(packet.sequence_number, 1)
        self._filler, self._filler_asked = filler.sequence_number, False
        self._remember(filler)
        self._probed_at = now
        self.counts.probes += 1
        # Sent once `packet` is: aiortc sends it before it next yields to the loop.
        self._spawn(self._send(filler))

    def _remember(self, packet: RtpPacket) -> None:
        self._history[packet.sequence_number] = _Sent(packet)
        self._history.move_to_end(packet.sequence_number)
        while len(self._history) > HISTORY_PACKETS:
            self._history.popitem(last=False)

    # ----------------------------------------------------------------------------- feedback

    def on_rtcp(self, packet: Any) -> None:
        """Count the receiver's feedback and note signs of loss (before aiortc handles the packet)."""
        now = self._clock()
        if isinstance(packet, RtcpRtpfbPacket) and packet.fmt == RTCP_RTPFB_NACK:
            self.counts.nacks += 1
            self.counts.nacked += len(packet.lost)
            if self._loss_in(packet.lost):
                self._loss_at = now
        elif isinstance(packet, RtcpPsfbPacket) and packet.fmt in (RTCP_PSFB_PLI, RTCP_PSFB_FIR):
            self.counts.keyframe_requests += 1
            self._loss_at = now
        elif isinstance(packet, (RtcpRrPacket, RtcpSrPacket)) and any(
            r.ssrc == self._sender._ssrc and r.fraction_lost for r in packet.reports
        ):
            self._loss_at = now

    def _loss_in(self, lost: list[int]) -> bool:
        """Whether a NACK reports loss: the first request for the newest probe's empty packet is its own gap's,
        made as it opened; any other request, that packet's again included, is for a packet lost."""
        echo = self._filler is not None and self._filler in lost and not self._filler_asked
        if echo:
            self._filler_asked = True
        return len(lost) > (1 if echo else 0)

    async def retransmit(self, sequence_number: int) -> None:
        """Resend a packet the receiver asked for, from the history (aiortc's `_retransmit`, replaced)."""
        sent = self._history.get(sequence_number)
        if sent is None:
            self.counts.not_in_history += 1
            return
        now = self._clock()
        if sent.resent_at is not None and now - sent.resent_at < RESEND_GUARD_S:
            self.counts.resend_guarded += 1
            return
        sent.resent_at = now
        await self._send(self._rtx(sent.packet), resent=True)

    def _rtx(self, packet: RtpPacket) -> RtpPacket:
        payload_type = getattr(self._sender, _RTX_ATTRIBUTE, None)
        if payload_type is None:
            return packet
        rtx = wrap_rtx(packet, payload_type, self._rtx_sequence_number, self._sender._rtx_ssrc)
        self._rtx_sequence_number = uint16_add(self._rtx_sequence_number, 1)
        return rtx

    async def _send(self, packet: RtpPacket, resent: bool = False) -> None:
        data = packet.serialize(getattr(self._sender, _EXTENSIONS_ATTRIBUTE))
        try:
            await self._sender.transport._send_rtp(data)
        except ConnectionError:
            return
        if resent:
            self.counts.resent += 1
            self.counts.resent_bytes += len(data)
            if self._on_resent is not None:
                self._on_resent(len(data), self._clock())

    def _spawn(self, coro: Awaitable[None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


class _RecordingHistory(dict[int, RtpPacket]):
    """aiortc's history dict, telling the recovery of each packet before aiortc sends it."""

    def __init__(self, recovery: SenderRecovery) -> None:
        super().__init__()
        self._recovery = recovery

    def __setitem__(self, key: int, packet: RtpPacket) -> None:
        try:
            self._recovery.on_sent(packet)
        except Exception:  # recovery is an extra: the packet must still go
            log.exception("recording a sent packet failed")
        super().__setitem__(packet.sequence_number % RTP_HISTORY_SIZE, packet)


def recover_sender(
    sender: Any,
    enabled: bool = True,
    on_resent: Callable[[int, float], None] | None = None,
    keyframes_under_loss: Callable[[float | None], None] | None = None,
) -> SenderRecovery | None:
    """Install the recovery on a video `RTCRtpSender` before it sends; None (with a warning, the sender left as
    aiortc made it) where this aiortc's sender keeps its history or handlers elsewhere. `keyframes_under_loss`:
    told, in place of the sender's encoder, the keyframe interval a receiver that cannot ask for packets needs
    while it reports loss (None where it can), for a sender whose frames come encoded."""
    history = getattr(sender, _HISTORY_ATTRIBUTE, None)
    handle: Callable[[Any], Awaitable[None]] | None = getattr(sender, "_handle_rtcp_packet", None)
    retransmit: Callable[[int], Awaitable[None]] | None = getattr(sender, "_retransmit", None)
    send: Callable[[Any], Awaitable[None]] | None = getattr(sender, "send", None)
    if not isinstance(history, dict) or handle is None or retransmit is None or send is None:
        log.warning("this aiortc's sender has no packet history where expected; retransmissions are aiortc's")
        return None
    recovery = SenderRecovery(sender, enabled, on_resent=on_resent, keyframes_under_loss=keyframes_under_loss)

    async def handle_rtcp_packet(packet: Any) -> None:
        try:
            recovery.on_rtcp(packet)
        except Exception:  # counting is an extra: aiortc's own handling must still run
            log.exception("reading the receiver's feedback failed")
        await handle(packet)

    async def counted_retransmit(sequence_number: int) -> None:
        kept = history.get(sequence_number % RTP_HISTORY_SIZE)
        if kept is not None and kept.sequence_number == sequence_number:
            recovery.counts.resent += 1
        else:
            recovery.counts.not_in_history += 1
        await retransmit(sequence_number)

    async def send_with(parameters: Any) -> None:
        recovery.negotiated(parameters)
        await send(parameters)

    setattr(sender, "_handle_rtcp_packet", handle_rtcp_packet)  # noqa: B010 (an instance's method is replaced)
    setattr(sender, "send", send_with)  # noqa: B010
    if enabled:
        setattr(sender, _HISTORY_ATTRIBUTE, _RecordingHistory(recovery))
        setattr(sender, "_retransmit", recovery.retransmit)  # noqa: B010
    else:
        setattr(sender, "_retransmit", counted_retransmit)  # noqa: B010
    return recovery
