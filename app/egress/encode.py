"""`SharedEncode`: one rendition of a live output's picture and sound, encoded once for every reader that takes
packets as they are (the RTSP server, WHEP viewers, SRT callers, pushes).

It listens to the output like any listener: `frame` keeps only the newest frame, `audio` queues a bounded amount
of sound, `keyframe` is a reader asking for one. While at least one reader is attached its thread encodes each
frame as it comes (no clock of its own: the output's feed is the one clock, and fills in with repeated frames
or the slate at its rate while nobody publishes), fitted to the rendition's size with its shape kept
(letterboxed), converted to I420 once and encoded to H.264 by the server's `EncoderPolicy`; the sound up to the
same instant, with silence where none came, is encoded once per audio codec a reader takes (AAC for RTMP and SRT,
Opus for WHIP). Frames are encoded at once and stamped on the rendition's frame grid, each in the slot of `1/fps`
it came in or, where that one is taken, the next: a slower publisher leaves slots empty rather than stretching
time, and one faster than the rendition's rate is thinned (a frame that would be stamped more than
`AHEAD_MAX_SLOTS` ahead of its time is dropped), never delayed.

Keyframes: a reader that attaches asks for one, so it starts at once rather than at the encoder's own next one;
asked keyframes leave at most once per `SWAPCAST_ENCODER_KEYFRAME_MIN_INTERVAL_S`, whoever asks (a push that
retries, a viewer's PLI, a new RTSP client), so readers cost each other no burst of keyframes: a request within
it is answered when it ends, or by the encoder's next periodic keyframe, which comes at least every
`SWAPCAST_ENCODER_KEYFRAME_INTERVAL_S` whatever the producer's rate. The encoder has no global header: every
keyframe carries its SPS and PPS, and a reader needs nothing sent before it.

Fan-out is guarded once, here: a reader whose `packet` raises is detached, logged and counted, and the others
go on. The thread ends, and its codecs go, when the last reader detaches: no reader, no encode.
"""

from __future__ import annotations

import collections
import fractions
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import av
import numpy as np
from av.audio.codeccontext import AudioCodecContext
from av.video.codeccontext import VideoCodecContext

from app.live.frame import OutputFrame, letterbox, to_i420
from app.media.encoder import EncoderPolicy
from app.media.mailbox import Mailbox
from app.observability import Metrics

log = logging.getLogger(__name__)

AUDIO_RATE = 48000
AUDIO_BITRATE = 128000
AUDIO_MAX_S = 0.5  # sound queued beyond this (the encode fell behind) is dropped, oldest first
VIDEO = "h264"
MICROSECONDS = 1_000_000
# How far ahead of its time a frame may be stamped (its own slot taken by the one before) before it is dropped.
AHEAD_MAX_SLOTS = 2.0
# Slots whose hand-over instants are kept for an encoder that returns frames late (NVENC's lookahead is shorter).
HANDED_KEPT = 32
WAIT_S = 0.5  # how often a thread without frames looks whether its readers are gone
RETRY_S = 1.0

Planes = np.ndarray[Any, np.dtype[np.uint8]]
Samples = np.ndarray[Any, np.dtype[np.float32]]


@dataclass(frozen=True)
class EncodedPacket:
    codec: str  # "h264", or the audio encoder's name ("aac", "libopus")
    data: bytes
    pts_us: int  # on the encode's own clock, the same for video and sound
    keyframe: bool
    dropped: int = 0  # video: the channel's frames replaced by a newer one before this one was encoded
    # Video: the `time.monotonic()` instant the output handed the frame over, before it waited to be encoded: what
    # a reader that times the picture by the wall clock stamps it with (the sound is timed by when it is due).
    handed_at: float | None = None
    audio_dropped_s: float = 0.0  # sound: what was dropped before this packet (the encode fell behind)

    @property
    def video(self) -> bool:
        return self.codec == VIDEO


class Reader(Protocol):
    """What takes a shared encode's packets: `audio_codec` is the sound it takes (None: the picture only);
    `packet` is called on the encode's thread and must not block (a reader queues the packet or drops it)."""

    @property
    def audio_codec(self) -> str | None: ...

    def packet(self, packet: EncodedPacket) -> None: ...


class SharedEncode:
    def __init__(
        self,
        width: int,
        height: int,
        fps: int,
        policy: EncoderPolicy,
        name: str = "",
        *,
        metrics: Metrics | None = None,
        kind: str = "channel",
    ) -> None:
        """`kind` labels the metrics (the kind of output the rendition is of)."""
        self.width, self.height, self.fps = width, height, fps
        self._policy = policy
        self._name = name
        self._frames_metric = metrics.egress_frames_encoded.labels(kind) if metrics is not None else None
        self._errors_metric = metrics.egress_reader_errors.labels(kind) if metrics is not None else None
        self._cond = threading.Condition()
        self._readers: list[Reader] = []
        self._thread: threading.Thread | None = None
        # The newest frame, not yet encoded, with the instant it was handed over.
        self._frames: Mailbox[tuple[OutputFrame, float]] = Mailbox(cond=self._cond)
        self._dropped_told = 0  # frames dropped up to the last packet that said how many
        self._keyframes_asked = 0  # requests so far; those up to `_keyframes_served` had a keyframe after them
        self._keyframes_served = 0
        self._audio: collections.deque[av.AudioFrame] = collections.deque()
        self._audio_queued = 0.0  # seconds
        self._audio_dropped = 0.0
        self.frames_encoded = 0  # video frames encoded so far (none while nothing is attached)
        self.reader_errors = 0  # readers detached because their `packet` raised
        self._handed: dict[int, float] = {}  # slot -> when its frame was handed over (the encode's thread)
        self.runs = 0  # times the encoder was opened (a reader came after none, or a codec failed)
        # What makes frames come at the full rate for a while (the path's feed: `probe`); None: nothing does.
        self.on_probe: Callable[[int], None] | None = None

    # ------------------------------------------------------------------------------ the output's listeners

    def frame(self, frame: OutputFrame) -> None:
        with self._cond:
            if not self._readers:
                return  # nothing is encoded without a reader: the frame is not even kept
            self._frames.put((frame, time.monotonic()))

    def audio(self, frame: av.AudioFrame, due: float) -> None:
        seconds = frame.samples / (frame.sample_rate or AUDIO_RATE)
        with self._cond:
            if not self._readers:
                return
            self._audio.append(frame)
            self._audio_queued += seconds
            while self._audio_queued > AUDIO_MAX_S and self._audio:
                dropped = self._audio.popleft()
                lost = dropped.samples / (dropped.sample_rate or AUDIO_RATE)
                self._audio_queued -= lost
                self._audio_dropped += lost

    def keyframe(self) -> None:
        with self._cond:
            self._keyframes_asked += 1

    def probe(self, frames: int) -> None:
        """A reader needs the next `frames` frames at the full rate (a client opening the stream)."""
        if self.on_probe is not None:
            self.on_probe(frames)

    # ------------------------------------------------------------------------------ the readers

    def attach(self, reader: Reader) -> None:
        """`reader` gets the packets from the next keyframe on (one is asked for now)."""
        with self._cond:
            if reader not in self._readers:
                self._readers.append(reader)
            self._keyframes_asked += 1
            if self._thread is None:
                self._start()

    def detach(self, reader: Reader) -> None:
        with self._cond:
            if reader in self._readers:
                self._readers.remove(reader)
            self._cond.notify()

    @property
    def readers(self) -> int:
        with self._cond:
            return len(self._readers)

    @property
    def frames_dropped(self) -> int:
        """Frames replaced by a newer one before they were encoded."""
        return self._frames.dropped

    @property
    def running(self) -> bool:
        with self._cond:
            return self._thread is not None

    def stats(self) -> dict[str, Any]:
        return {
            "size": f"{self.width}x{self.height}",
            "fps": self.fps,
            "running": self.running,
            "readers": self.readers,
            "frames_encoded": self.frames_encoded,
            "frames_dropped": self.frames_dropped,
            "reader_errors": self.reader_errors,
        }

    # ------------------------------------------------------------------------------ the thread

    def _start(self) -> None:
        self.runs += 1
        self._thread = threading.Thread(target=self._run, name=f"shared-encode-{self._name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._encode()
        except Exception:  # a codec that fails: readers see no packets (pushes reconnect); the next run retries
            log.exception("shared encode %s failed", self._name)
            time.sleep(RETRY_S)  # not at once: what failed may well fail again
        finally:
            with self._cond:
                self._thread = None
                self._frames.discard()
                if self._readers:  # attached while this run was ending: a new run serves them
                    self._start()

    def _next(self) -> tuple[OutputFrame, float] | None:
        """Wait for the next frame and when it was handed over; None once no reader is left."""
        with self._cond:
            while self._readers and not self._frames.has_item:
                self._cond.wait(WAIT_S)
            frame = self._frames.take()
            return frame if self._readers else None

    def _taken(self) -> tuple[int, int, list[av.AudioFrame], float, list[Reader]]:
        """What goes with the frame about to be encoded: frames dropped since the last, keyframe requests so far,
        the sound since the last and how much of it was dropped, the readers now."""
        with self._cond:
            total = sum(self._frames.drops.values())
            dropped, self._dropped_told = total - self._dropped_told, total
            pending = list(self._audio)
            self._audio.clear()
            self._audio_queued = 0.0
            audio_dropped, self._audio_dropped = self._audio_dropped, 0.0
            return dropped, self._keyframes_asked, pending, audio_dropped, list(self._readers)

    def _encode(self) -> None:
        video = self._policy.open_push(self.width, self.height, self.fps)
        tracks: dict[str, _AudioTrack] = {}
        interval = 1.0 / self.fps
        start = time.monotonic()
        tick = -1  # the last slot encoded
        min_keyframe_s = self._policy.settings.keyframe_min_interval_s
        # The encoder's own interval counts frames, which a slow producer stretches: one is forced by the clock too.
        max_keyframe_s = self._policy.keyframe_interval_s
        last_keyframe = -math.inf  # monotonic
        self._handed.clear()
        with self._cond:
            self._audio.clear()
            self._audio_queued = 0.0
        while (item := self._next()) is not None:
            frame, handed_at = item
            now = time.monotonic()
            exact = (now - start) / interval  # slots are centred on multiples of the interval
            slot = max(tick + 1, math.floor(exact + 0.5))
            if slot - exact > AHEAD_MAX_SLOTS:  # frames come faster than the rendition's rate
                self._frames.count_drop("ahead")
                continue
            tick = slot
            dropped, asked, pending, audio_dropped, readers = self._taken()
            wanted = asked > self._keyframes_served
            since = now - last_keyframe
            forced = (wanted and since >= min_keyframe_s) or since >= max_keyframe_s
            packets = self._video(video, self._planes(frame), tick, forced, dropped, handed_at)
            self.frames_encoded += 1
            if self._frames_metric is not None:
                self._frames_metric.inc()
            if any(p.keyframe for p in packets):
                last_keyframe = now
                self._keyframes_served = asked
            codecs = {r.audio_codec for r in readers if r.audio_codec is not None}
            for codec in codecs - tracks.keys():
                tracks[codec] = _AudioTrack(codec, tick / self.fps)
            for codec in tracks.keys() - codecs:  # its last reader went
                del tracks[codec]
            for track in tracks.values():
                packets += track.encode(pending, tick / self.fps, audio_dropped)
            self._fan_out(packets, readers)

    def _fan_out(self, packets: list[EncodedPacket], readers: list[Reader]) -> None:
        for reader in readers:
            try:
                for packet in packets:
                    if packet.video or packet.codec == reader.audio_codec:
                        reader.packet(packet)
            except Exception:  # one reader's failure must not cost the others their packets, or stop the encode
                self.detach(reader)
                self.reader_errors += 1
                if self._errors_metric is not None:
                    self._errors_metric.inc()
                log.exception("shared encode %s: a reader failed and was detached", self._name)

    def _video(
        self, codec: VideoCodecContext, planes: Planes, tick: int, keyframe: bool, dropped: int, handed_at: float
    ) -> list[EncodedPacket]:
        frame = av.VideoFrame.from_numpy_buffer(planes, format="yuv420p")
        frame.pts, frame.time_base = tick, fractions.Fraction(1, self.fps)
        frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        self._handed[tick] = handed_at
        packets = []
        for p in codec.encode(frame):  # an encoder with a delay returns an earlier frame: found by its slot
            at = self._handed.pop(p.pts, handed_at) if p.pts is not None else handed_at
            packets.append(EncodedPacket(VIDEO, bytes(p), _us(p), p.is_keyframe, dropped=dropped, handed_at=at))
        for old in [t for t in self._handed if t < tick - HANDED_KEPT]:
            del self._handed[old]
        return packets

    def _planes(self, frame: OutputFrame) -> Planes:
        """The I420 planes at the rendition's size: a frame of that size gives its own (converted once for every
        output); another is letterboxed to it."""
        if frame.size != (self.width, self.height) or not frame.even:
            return to_i420(letterbox(frame.image, self.width, self.height))
        return frame.i420()


def _us(packet: av.Packet) -> int:
    assert packet.pts is not None and packet.time_base is not None
    return round(packet.pts * packet.time_base * MICROSECONDS)


def open_audio(codec_name: str) -> AudioCodecContext:
    """An opened audio encoder of the pushes' settings."""
    codec = av.CodecContext.create(codec_name, "w")
    assert isinstance(codec, AudioCodecContext)
    configure_audio(codec)
    codec.open()
    return codec


def configure_audio(codec: AudioCodecContext) -> None:
    """48 kHz stereo at `AUDIO_BITRATE`: the channel's encode, and each push's muxer, whose encoder of the same
    settings (opened, never fed) gives the muxer the same description of the sound (AAC's AudioSpecificConfig,
    Opus's header)."""
    codec.sample_rate = AUDIO_RATE
    codec.layout = "stereo"
    formats = [f.name for f in codec.codec.audio_formats or []]
    codec.format = "fltp" if "fltp" in formats or not formats else formats[0]
    codec.bit_rate = AUDIO_BITRATE
    codec.time_base = fractions.Fraction(1, AUDIO_RATE)


class _AudioTrack:
    """The sound in one codec: what came, resampled to 48 kHz stereo, and silence where nothing came, laid in
    encoder-sized frames so that the sound encoded always reaches the video's time."""

    def __init__(self, codec_name: str, now_s: float) -> None:
        self.codec = open_audio(codec_name)
        self.name = codec_name
        self.frame_samples = self.codec.frame_size or 960
        self.sent = round(now_s * AUDIO_RATE)  # samples: on the video's clock from the start
        self._buffer = np.zeros((2, 0), np.float32)
        self._to_fltp: av.AudioResampler | None = None
        self._input: tuple[str, str, int] | None = None

    def encode(self, frames: list[av.AudioFrame], until_s: float, dropped_s: float) -> list[EncodedPacket]:
        for frame in frames:
            self._buffer = np.concatenate([self._buffer, self._planar(frame)], axis=1)
        # Keep no more than a little beyond the video's time: the rest is late and would only add delay.
        excess = self._buffer.shape[1] - round(AUDIO_MAX_S * AUDIO_RATE)
        if excess > 0:
            self._buffer = self._buffer[:, excess:]
        target = round(until_s * AUDIO_RATE)
        out: list[EncodedPacket] = []
        while self.sent + self.frame_samples <= target:
            chunk = self._buffer[:, : self.frame_samples]
            self._buffer = self._buffer[:, chunk.shape[1] :]
            if chunk.shape[1] < self.frame_samples:
                chunk = np.concatenate([chunk, np.zeros((2, self.frame_samples - chunk.shape[1]), np.float32)], axis=1)
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(chunk), format="fltp", layout="stereo")
            frame.sample_rate = AUDIO_RATE
            frame.pts, frame.time_base = self.sent, fractions.Fraction(1, AUDIO_RATE)
            for p in self.codec.encode(frame):  # PyAV converts to the codec's sample format (Opus: interleaved)
                out.append(EncodedPacket(self.name, bytes(p), _us(p), True, audio_dropped_s=dropped_s))
                dropped_s = 0.0
            self.sent += self.frame_samples
        return out

    def _planar(self, frame: av.AudioFrame) -> Samples:
        kind = (frame.format.name, frame.layout.name, frame.sample_rate)
        if self._to_fltp is None or kind != self._input:
            self._to_fltp = av.AudioResampler(format="fltp", layout="stereo", rate=AUDIO_RATE)
            self._input = kind
        frame.pts = None  # the resampler would otherwise follow the sender's clock
        parts = [np.asarray(f.to_ndarray(), np.float32) for f in self._to_fltp.resample(frame)]
        return np.concatenate(parts, axis=1) if parts else np.zeros((2, 0), np.float32)
