"""`PushEncode`: a channel's picture and sound encoded once for all its pushes (`app.media.push`).

It listens to the channel's feed like any output: `frame` keeps only the newest frame, `audio` queues a bounded
amount of sound, `keyframe` asks for a keyframe. While at least one push is attached, its thread ticks at the
channel's rate: one frame per tick (the newest, or the one before again when none came) converted to I420 and
encoded to H.264 by the server's `EncoderPolicy`, and the sound up to the same instant, with silence where none
came, encoded once per audio codec in use (AAC for RTMP and SRT, Opus for WHIP), so platforms get the
constant-rate stream with a continuous audio track they expect. Each packet goes to every attached push whose
audio codec it is (the video to all); `Subscriber.packet` must not block: a push queues it or drops it.

A push that attaches asks for a keyframe, so it starts within a tick rather than the keyframe interval; asked
keyframes leave at most once per `KEYFRAME_MIN_S` (a push that fails and retries, or several that join at once,
cost the others no burst of keyframes: a request within it is answered when it ends, or by the encoder's own
next keyframe). The encoder has no global header: every keyframe carries its SPS and PPS, and a push needs
nothing sent before it. The thread ends, and its codecs go, when the last push detaches: no push, no encode.
"""

from __future__ import annotations

import collections
import fractions
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Protocol

import av
import cv2
import numpy as np
from av.audio.codeccontext import AudioCodecContext
from av.video.codeccontext import VideoCodecContext

from app.live.frame import OutputFrame, to_i420
from app.media.encoder import EncoderPolicy

log = logging.getLogger(__name__)

AUDIO_RATE = 48000
AUDIO_BITRATE = 128000
AUDIO_MAX_S = 0.5  # sound queued beyond this (the encode fell behind) is dropped, oldest first
VIDEO = "h264"
MICROSECONDS = 1_000_000
KEYFRAME_MIN_S = 1.0
RETRY_S = 1.0

Planes = np.ndarray[Any, np.dtype[np.uint8]]
Samples = np.ndarray[Any, np.dtype[np.float32]]


@dataclass(frozen=True)
class EncodedPacket:
    codec: str  # "h264", or the audio encoder's name ("aac", "libopus")
    data: bytes
    pts_us: int  # on the encode's own clock, the same for video and sound
    keyframe: bool
    repeated: bool = False  # video: the last frame sent again (no new one came)
    dropped: int = 0  # video: the channel's frames replaced by a newer one before this one was encoded
    audio_dropped_s: float = 0.0  # sound: what was dropped before this packet (the encode fell behind)

    @property
    def video(self) -> bool:
        return self.codec == VIDEO


class Subscriber(Protocol):
    audio_codec: str

    def packet(self, packet: EncodedPacket) -> None: ...


class PushEncode:
    def __init__(self, width: int, height: int, fps: int, policy: EncoderPolicy, name: str = "") -> None:
        self.width, self.height, self.fps = width, height, fps
        self._policy = policy
        self._name = name
        self._lock = threading.Lock()
        self._subscribers: list[Subscriber] = []
        self._thread: threading.Thread | None = None
        self._newest: OutputFrame | None = None
        self._fresh = False
        self._dropped = 0
        self._keyframes_asked = 0  # requests so far; those up to `_keyframes_served` had a keyframe after them
        self._keyframes_served = 0
        self._audio: collections.deque[av.AudioFrame] = collections.deque()
        self._audio_queued = 0.0  # seconds
        self._audio_dropped = 0.0
        self.frames_encoded = 0  # video frames encoded so far (none while nothing is attached)

    # ------------------------------------------------------------------------------ the feed's listeners

    def frame(self, frame: OutputFrame) -> None:
        with self._lock:
            if self._fresh:
                self._dropped += 1
            self._newest, self._fresh = frame, True

    def audio(self, frame: av.AudioFrame, due: float) -> None:
        seconds = frame.samples / (frame.sample_rate or AUDIO_RATE)
        with self._lock:
            self._audio.append(frame)
            self._audio_queued += seconds
            while self._audio_queued > AUDIO_MAX_S and self._audio:
                dropped = self._audio.popleft()
                lost = dropped.samples / (dropped.sample_rate or AUDIO_RATE)
                self._audio_queued -= lost
                self._audio_dropped += lost

    def keyframe(self) -> None:
        with self._lock:
            self._keyframes_asked += 1

    # ------------------------------------------------------------------------------ the pushes

    def attach(self, subscriber: Subscriber) -> None:
        """`subscriber` gets the packets from the next keyframe on (one is asked for now)."""
        with self._lock:
            self._subscribers.append(subscriber)
            self._keyframes_asked += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"push-encode-{self._name}", daemon=True)
                self._thread.start()

    def detach(self, subscriber: Subscriber) -> None:
        with self._lock:
            if subscriber in self._subscribers:
                self._subscribers.remove(subscriber)

    @property
    def running(self) -> bool:
        with self._lock:
            return self._thread is not None

    # ------------------------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            self._encode()
        except Exception:  # a codec that fails: the pushes see no packets and reconnect; the next run retries
            log.exception("push encode %s failed", self._name)
            time.sleep(RETRY_S)  # not at once: what failed may well fail again
        finally:
            with self._lock:
                self._thread = None
                if self._subscribers:  # attached while this run was ending: a new run serves them
                    self._thread = threading.Thread(target=self._run, name=f"push-encode-{self._name}", daemon=True)
                    self._thread.start()

    def _encode(self) -> None:
        video = self._policy.open_push(self.width, self.height, self.fps)
        tracks: dict[str, _AudioTrack] = {}
        interval = 1.0 / self.fps
        start = time.monotonic()
        ticks = 0
        last: Planes | None = None
        last_keyframe = -KEYFRAME_MIN_S  # monotonic
        with self._lock:
            self._audio.clear()
            self._audio_queued = 0.0
        while True:
            with self._lock:
                subscribers = list(self._subscribers)
                if not subscribers:
                    return
                frame, fresh = self._newest, self._fresh
                self._fresh = False
                dropped, self._dropped = self._dropped, 0
                asked = self._keyframes_asked
                wanted = asked > self._keyframes_served
                pending = list(self._audio)
                self._audio.clear()
                self._audio_queued = 0.0
                audio_dropped, self._audio_dropped = self._audio_dropped, 0.0
            packets: list[EncodedPacket] = []
            if fresh and frame is not None:
                last = self._planes(frame)
            if last is not None:
                forced = wanted and time.monotonic() - last_keyframe >= KEYFRAME_MIN_S
                encoded = self._video(video, last, ticks, forced, not fresh, dropped)
                self.frames_encoded += 1
                if any(p.keyframe for p in encoded):
                    last_keyframe = time.monotonic()
                    with self._lock:
                        self._keyframes_served = asked
                packets += encoded
                ticks += 1
                codecs = {s.audio_codec for s in subscribers}
                for codec in codecs - tracks.keys():
                    tracks[codec] = _AudioTrack(codec, ticks / self.fps)
                for codec in tracks.keys() - codecs:  # its last push went
                    del tracks[codec]
                for track in tracks.values():
                    packets += track.encode(pending, ticks / self.fps, audio_dropped)
            for packet in packets:
                for subscriber in subscribers:
                    if packet.video or packet.codec == subscriber.audio_codec:
                        subscriber.packet(packet)
            delay = start + ticks * interval - time.monotonic()
            if delay < -1.0:  # fell a second behind (a stall): go on from now rather than catch up in a burst
                start = time.monotonic() - ticks * interval
            elif delay > 0:
                time.sleep(delay)
            elif last is None:
                time.sleep(interval)

    def _video(
        self, codec: VideoCodecContext, planes: Planes, tick: int, keyframe: bool, repeated: bool, dropped: int
    ) -> list[EncodedPacket]:
        frame = av.VideoFrame.from_numpy_buffer(planes, format="yuv420p")
        frame.pts, frame.time_base = tick, fractions.Fraction(1, self.fps)
        frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        return [
            EncodedPacket(VIDEO, bytes(p), _us(p), p.is_keyframe, repeated=repeated, dropped=dropped)
            for p in codec.encode(frame)
        ]

    def _planes(self, frame: OutputFrame) -> Planes:
        """The I420 planes at the encode's size (the channel's frames have it: their planes, converted once)."""
        if frame.size != (self.width, self.height) or not frame.even:
            resized = cv2.resize(frame.image, (self.width, self.height), interpolation=cv2.INTER_AREA)
            return to_i420(np.asarray(resized, np.uint8))
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
