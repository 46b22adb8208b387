"""Recovery of a received video stream after loss: a time limit on holes, and keyframe requests at a bounded rate.

aiortc's video receiver (1.16) keeps a 512-packet jitter buffer; frames behind a missing packet wait there with
no time limit, until the packet is retransmitted or 512 newer packets have come, and only then is a keyframe
asked for (PLI). After a 3 s outage the ~300 packets sent into it are gone for good (a sender keeps the last
128 for retransmission: aiortc's, and a browser's for about a second), so a session's input stood still for
another 2-3 s while ~200 more packets arrived. The same wait follows a packet whose retransmission is lost too.

`guard_receiver` replaces, on one receiver, the jitter buffer with `GuardedJitterBuffer` and its PLI sender
with `PliLimiter`:

- A packet still missing `RENACK_S` after aiortc's receiver asked for it is asked for again (NACK), every
  `RENACK_S` until it comes or is given up: aiortc asks once, when the gap appears, and again only when a new
  gap appears, so a lost request or a lost retransmission left the hole to the time limit below (one freeze of
  over half a second every few seconds at 1% loss each way).
- The first hole in the buffer (frames behind it wait) is given up once it is `GIVE_UP_S` old, counted from
  the last packet that arrived before it: after an outage that is at once, on the first packet after the
  link's return; after a loss, time for a retransmission and a second request. The buffer then skips past
  the hole to the next whole frame, asks for a keyframe, and passes no frame on until one comes (a frame
  after the hole refers to what was lost: decoded, it would show damage, and the face pipeline would work
  on it).
- Keyframe requests, from every cause (the buffer, aiortc's overflow and decode-error checks), leave at most
  once per `PLI_INTERVAL_S`: under a bandwidth cap each keyframe is a burst that can overflow the queue
  again, and a storm of requests makes the sender send nothing else. A request within the interval is owed
  and leaves when the interval ends, unless a keyframe came meanwhile.

The sending side's share (a keyframe at most once per interval, one when a session's input resumes after a
gap) is in app.media.encoder and app.media.webrtc.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiortc.jitterbuffer import JitterBuffer, JitterFrame
from aiortc.rtp import RtpPacket
from aiortc.utils import uint16_add, uint16_gt

log = logging.getLogger(__name__)

CAPACITY = 512  # aiortc's: a keyframe of a large frame needs the room
GIVE_UP_S = 0.5  # a hole this old (from the last arrival before it) is not coming any more
RENACK_S = 0.1  # a packet still missing this long after it was asked for is asked for again (a home link's RTT)
RENACK_MAX = 64  # sequence numbers in one repeated request at most (the oldest first)
PLI_INTERVAL_S = 1.0  # at most one keyframe request per interval
_BUFFER_ATTRIBUTE = "_RTCRtpReceiver__jitter_buffer"  # where aiortc's receiver keeps its buffer


def is_keyframe(data: bytes) -> bool:
    """Whether an assembled frame (as aiortc's depayloaders give it) can be decoded on its own: H.264 (Annex B
    from its first byte, with an IDR slice: NAL unit type 5) or VP8 (a keyframe's frame tag and start code).
    A frame that lost its first packet is neither."""
    if data.startswith((b"\x00\x00\x00\x01", b"\x00\x00\x01")):
        start = data.find(b"\x00\x00\x01")
        while start != -1 and start + 3 < len(data):
            if data[start + 3] & 0x1F == 5:
                return True
            start = data.find(b"\x00\x00\x01", start + 3)
        return False
    return len(data) >= 6 and not data[0] & 0x01 and data[3:6] == b"\x9d\x01\x2a"


@dataclass
class RecoveryCounts:
    holes_given_up: int = 0  # holes skipped after GIVE_UP_S
    packets_skipped: int = 0  # packets (present or not) removed with them
    frames_dropped: int = 0  # complete frames not passed on while waiting for a keyframe
    keyframes: int = 0  # keyframes passed on
    pli_sent: int = 0
    pli_deferred: int = 0  # requests that came within the interval (sent later, or made needless by a keyframe)
    nacks_repeated: int = 0  # NACKs sent again for packets still missing after RENACK_S

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


class GuardedJitterBuffer(JitterBuffer):
    """aiortc's video jitter buffer with a time limit on holes (see the module docstring)."""

    def __init__(
        self,
        capacity: int = CAPACITY,
        give_up_s: float = GIVE_UP_S,
        counts: RecoveryCounts | None = None,
        clock: Callable[[], float] = time.monotonic,
        renack: Callable[[int, list[int]], None] | None = None,
        renack_s: float = RENACK_S,
    ) -> None:
        super().__init__(capacity, is_video=True)
        self.give_up_s = give_up_s
        self.renack_s = renack_s
        self._renack = renack  # (media SSRC, sequence numbers): send a NACK for them again
        self._renacked_at = float("-inf")
        self.counts = counts if counts is not None else RecoveryCounts()
        self._clock = clock
        self._newest: int | None = None
        self._last_arrival: float | None = None
        # missing sequence number -> the arrival time of the packet before it (when it was due at the latest)
        self._missing_since: dict[int, float] = {}
        self.awaiting_keyframe = False
        self.last_keyframe_at: float | None = None

    def add(self, packet: RtpPacket) -> tuple[bool, JitterFrame | None]:
        now = self._clock()
        seq = packet.sequence_number
        self._note_arrival(seq, now)
        pli, frame = super().add(packet)
        origin, newest = self._origin, self._newest
        if origin is not None and newest is not None and uint16_add(newest, -origin) >= self.capacity:
            self._newest, self._missing_since = seq, {}  # aiortc started over (a jump back)
        hole = self._hole_too_old(now) if frame is None else None
        if hole is not None:
            self._skip_hole(hole)
            self.awaiting_keyframe = pli = True
            frame = self._remove_frame(seq)
        elif self._renack is not None and now - self._renacked_at >= self.renack_s:
            self._ask_again(packet.ssrc, now)
        if frame is not None and self.awaiting_keyframe:
            if is_keyframe(frame.data):
                self.awaiting_keyframe = False
            else:
                self.counts.frames_dropped += 1
                return True, None  # the request is limited by the PLI sender
        if frame is not None and is_keyframe(frame.data):
            self.counts.keyframes += 1
            self.last_keyframe_at = now
        return pli, frame

    def _note_arrival(self, seq: int, now: float) -> None:
        if self._newest is None:
            self._newest = seq
        elif uint16_gt(seq, self._newest):
            missing = min(uint16_add(seq, -self._newest) - 1, self.capacity)
            since = self._last_arrival if self._last_arrival is not None else now
            for i in range(1, missing + 1):
                self._missing_since[uint16_add(self._newest, i)] = since
            self._newest = seq
            if len(self._missing_since) > 2 * self.capacity:
                self._forget_before(self._origin)
        else:
            self._missing_since.pop(seq, None)
        self._last_arrival = now

    def _ask_again(self, ssrc: int, now: float) -> None:
        """NACK again the packets of the buffer's window missing for `renack_s` or longer (the newer ones were
        just asked for by aiortc's receiver)."""
        origin = self._origin
        overdue = [
            seq
            for seq, since in self._missing_since.items()
            if now - since >= self.renack_s and (origin is None or not uint16_gt(origin, seq))
        ]
        if overdue and self._renack is not None:
            self._renacked_at = now
            self.counts.nacks_repeated += 1
            self._renack(ssrc, overdue[:RENACK_MAX])

    def _first_hole(self) -> int | None:
        """How many packets from the head the first missing one is, while a later one is here; None if none is.
        The scan stops there: it is short unless a hole holds frames back."""
        origin, newest = self._origin, self._newest
        if origin is None or newest is None or not uint16_gt(newest, origin):
            return None
        for i in range(uint16_add(newest, -origin)):
            if self._packets[(origin + i) % self.capacity] is None:
                return i
        return None

    def _hole_too_old(self, now: float) -> int | None:
        """The first hole's offset from the head if it has been missing longer than `give_up_s`."""
        hole = self._first_hole()
        if hole is None or self._origin is None:
            return None
        since = self._missing_since.setdefault(uint16_add(self._origin, hole), now)
        return hole if now - since > self.give_up_s else None

    def _skip_hole(self, hole: int) -> None:
        """Remove everything up to the hole, the hole, and the frame the first packet after it belongs to (it may
        have lost its start): up to the first packet of a later frame."""
        assert self._origin is not None and self._newest is not None
        span = uint16_add(self._newest, -self._origin) + 1
        after: int | None = None
        count = span
        for i in range(hole + 1, span):
            packet = self._packets[(self._origin + i) % self.capacity]
            if packet is None:
                continue
            if after is None:
                after = packet.timestamp
            elif packet.timestamp != after:
                count = i
                break
        self.remove(count)
        self._forget_before(self._origin)
        self.counts.holes_given_up += 1
        self.counts.packets_skipped += count

    def _forget_before(self, origin: int | None) -> None:
        if origin is None:
            return
        self._missing_since = {s: t for s, t in self._missing_since.items() if not uint16_gt(origin, s)}


class PliLimiter:
    """A receiver's PLI sender that sends at most once per `interval_s`; one request in between is owed."""

    def __init__(
        self,
        send: Callable[[int], Awaitable[None]],
        buffer: GuardedJitterBuffer,
        interval_s: float = PLI_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._send = send
        self._buffer = buffer
        self.interval_s = interval_s
        self._clock = clock
        self._last: float | None = None
        self._owed: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def counts(self) -> RecoveryCounts:
        return self._buffer.counts

    async def __call__(self, media_ssrc: int) -> None:
        now = self._clock()
        if self._last is None or now - self._last >= self.interval_s:
            await self._send_now(media_ssrc, now)
            return
        self.counts.pli_deferred += 1
        if self._owed is None:
            delay = self._last + self.interval_s - now
            self._owed = asyncio.get_running_loop().call_later(delay, self._pay, media_ssrc)

    async def _send_now(self, media_ssrc: int, now: float) -> None:
        self._last = now
        self.counts.pli_sent += 1
        await self._send(media_ssrc)

    def _pay(self, media_ssrc: int) -> None:
        self._owed = None
        sent = self._last
        keyframe = self._buffer.last_keyframe_at
        if keyframe is not None and sent is not None and keyframe >= sent and not self._buffer.awaiting_keyframe:
            return  # the keyframe asked for came: nothing is owed
        task = asyncio.ensure_future(self._send_now(media_ssrc, self._clock()))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def close(self) -> None:
        if self._owed is not None:
            self._owed.cancel()
            self._owed = None


@dataclass
class ReceiverGuard:
    buffer: GuardedJitterBuffer
    pli: PliLimiter

    @property
    def counts(self) -> RecoveryCounts:
        return self.buffer.counts

    def close(self) -> None:
        self.pli.close()


def guard_receiver(receiver: Any) -> ReceiverGuard | None:
    """Install the guarded buffer (asking again for packets still missing, through the receiver's own NACK
    sender) and the PLI limiter on a video `RTCRtpReceiver` before media arrives; None (with a warning, the
    receiver left as aiortc made it) where this aiortc keeps its buffer elsewhere."""
    if not isinstance(getattr(receiver, _BUFFER_ATTRIBUTE, None), JitterBuffer):
        log.warning("this aiortc's receiver has no jitter buffer where expected; video recovery is aiortc's own")
        return None
    tasks: set[asyncio.Task[None]] = set()

    def renack(media_ssrc: int, lost: list[int]) -> None:
        task = asyncio.ensure_future(receiver._send_rtcp_nack(media_ssrc, lost))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    buffer = GuardedJitterBuffer(renack=renack)
    setattr(receiver, _BUFFER_ATTRIBUTE, buffer)
    limiter = PliLimiter(receiver._send_rtcp_pli, buffer)
    setattr(receiver, "_send_rtcp_pli", limiter)  # noqa: B010 (an instance's method is replaced)
    return ReceiverGuard(buffer, limiter)
