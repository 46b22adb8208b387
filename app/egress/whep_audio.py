"""The audio of WHEP viewers: one Opus encode of an output's (already delayed, in sync) audio, shared by every
viewer the way the video encode is.

`SharedOpusEncoder` turns each audio frame into Opus packets once (libopus through PyAV, 20 ms frames, as
aiortc's own encoder does); each viewer's `EncodedAudioTrack` hands those packets to its aiortc sender, which
packetizes them without encoding again. Encoding runs on the event loop: one 20 ms frame costs well under a
millisecond, less than a thread hand-off would.

The output hands its sound over when it is due, in sync with its picture; the picture then still has the viewers'
video encode and the hand-over to the event loop before it leaves, which a loaded machine makes take tens or
hundreds of milliseconds. Viewers' senders time each stream by when its packets leave (their RTCP reports map
RTP time to the time of sending), so `PictureDelay` holds the sound back by as long as the picture currently takes.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections import deque
from collections.abc import Callable
from fractions import Fraction

import av
from av.audio.codeccontext import AudioCodecContext

from app.media.packet_track import PacketTrack

log = logging.getLogger(__name__)

RATE = 48000
FRAME_SAMPLES = 960
TIME_BASE = Fraction(1, RATE)
BITRATE = 96000
# Packets a viewer may hold (200 ms); the oldest go beyond that, so a stalled viewer never lags behind.
VIEWER_QUEUE_PACKETS = 10
# The picture's delay is followed from this on (below it no viewer notices, and the sound goes at once)...
FOLLOW_FROM_S = 0.01
# ...and up to this: a picture later still is stalled, and sound held longer would only pile up.
FOLLOW_AT_MOST_S = 1.0
# Weight of the newest frame's delay in the delay followed.
DELAY_SMOOTHING = 0.2


class PictureDelay:
    """On the event loop: the sound handed to `sink` as long after it is due as the picture currently takes to
    reach the viewers (`picture_took`), in order, never sooner than the sound before it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sink: Callable[[av.AudioFrame], None]) -> None:
        self.delay_s = 0.0  # what the picture takes, smoothed
        self._loop = loop
        self._sink = sink
        self._held: deque[tuple[float, av.AudioFrame]] = deque()  # (release time on the loop's clock, frame)
        self._last_release = -math.inf
        self._timer: asyncio.TimerHandle | None = None

    def picture_took(self, seconds: float) -> None:
        """A frame reached the viewers `seconds` after the output handed it over."""
        seconds = min(max(seconds, 0.0), FOLLOW_AT_MOST_S)
        self.delay_s += DELAY_SMOOTHING * (seconds - self.delay_s)

    def offer(self, frame: av.AudioFrame) -> None:
        now = self._loop.time()
        delay = self.delay_s if self.delay_s >= FOLLOW_FROM_S else 0.0
        release = self._last_release = max(now + delay, self._last_release)
        if release <= now and not self._held:
            self._sink(frame)
            return
        self._held.append((release, frame))
        self._arm()

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._held.clear()

    def _arm(self) -> None:
        if self._timer is None and self._held:
            self._timer = self._loop.call_at(self._held[0][0], self._release)

    def _release(self) -> None:
        self._timer = None
        now = self._loop.time()
        while self._held and self._held[0][0] <= now:
            self._sink(self._held.popleft()[1])
        self._arm()


class EncodedAudioTrack(PacketTrack):
    """One viewer's audio: the shared encoder's Opus packets, newest kept when it falls behind."""

    kind = "audio"

    def deliver(self, packet: av.Packet) -> None:
        if self.readyState != "live":
            return
        while self._queue.qsize() >= VIEWER_QUEUE_PACKETS:
            self._queue.get_nowait()
            self.packets_dropped += 1
        self._queue.put_nowait(packet)


class SharedOpusEncoder:
    """Audio frames in (any format), Opus packets out with continuous timestamps, to every track in `tracks`."""

    def __init__(self) -> None:
        self.tracks: list[EncodedAudioTrack] = []
        self.packets_encoded = 0
        self.errors = 0
        self._codec: AudioCodecContext | None = None
        self._resampler: av.AudioResampler | None = None
        self._pts = 0

    def offer(self, frame: av.AudioFrame) -> None:
        """On the event loop; skipped at once while no viewer takes audio."""
        if not self.tracks:
            return
        try:
            if self._codec is None or self._resampler is None:
                self._codec, self._resampler = self._open()
            frame.pts = None  # the resampler would otherwise follow the sender's timestamps
            for piece in self._resampler.resample(frame):
                piece.pts = self._pts
                piece.time_base = TIME_BASE
                self._pts += piece.samples
                for packet in self._codec.encode(piece):
                    packet.time_base = TIME_BASE
                    self.packets_encoded += 1
                    for track in self.tracks:
                        track.deliver(packet)
        except Exception:
            self.errors += 1
            if self.errors == 1:
                log.exception("viewers' audio: encoding failed (counted from now on)")
            self._codec = self._resampler = None

    @staticmethod
    def _open() -> tuple[AudioCodecContext, av.AudioResampler]:
        codec = av.CodecContext.create("libopus", "w")
        assert isinstance(codec, AudioCodecContext)
        codec.bit_rate = BITRATE
        codec.format = "s16"
        codec.layout = "stereo"
        codec.sample_rate = RATE
        codec.time_base = TIME_BASE
        codec.options = {"application": "voip"}
        codec.open()
        return codec, av.AudioResampler(format="s16", layout="stereo", rate=RATE, frame_size=FRAME_SAMPLES)
