"""The audio of WHEP viewers: one Opus encode of an output's (already delayed, in sync) audio, shared by every
viewer the way the video encode is.

`SharedOpusEncoder` turns each audio frame into Opus packets once (libopus through PyAV, 20 ms frames, as
aiortc's own encoder does); each viewer's `EncodedAudioTrack` hands those packets to its aiortc sender, which
packetizes them without encoding again. Encoding runs on the event loop: one 20 ms frame costs well under a
millisecond, less than a thread hand-off would.
"""

from __future__ import annotations

import logging
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
