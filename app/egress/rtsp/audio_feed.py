"""Feeding one path's audio stream: PCM pushed in, as 48 kHz stereo S16, into

    appsrc (live, timestamped here) → opusenc → rtpopuspay

Opus, because FFmpeg's RTSP client (OBS's media source, ffmpeg, PyAV) and GStreamer both depacketize it,
it adds no encoder priming delay (AAC adds 1024 samples) and it is what WebRTC clients send, so nothing is
converted on the way but the samples themselves.

Timestamps are the running time at which each chunk was offered (or was due, when the caller says), as the
video's are the running time its frames were handed to the encode (`packet_feed`), so a chunk that the caller
hands over in sync with the video plays in sync with it.
Chunks that follow each other within `CONTINUITY_S` are laid end to end instead (the encoder wants a
continuous signal, and the chunks come with the jitter of the network and the event loop); a larger gap
starts a new run. While no audio comes (a quiet microphone, no microphone yet), silence fills the stream
after `SILENCE_AFTER_S`, so the stream never stalls and a client's DESCRIBE, which waits for every
stream of the media to produce data, is answered at once.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any

import av

from app.egress.rtsp.appsrc_feeder import NS, AppsrcFeeder, running_time_ns
from app.egress.rtsp.bindings import Bindings

RATE = 48000
CHANNELS = 2
BYTES_PER_SAMPLE = 2 * CHANNELS
CHUNK_SAMPLES = 960  # 20 ms, Opus's usual frame
OPUS_BITRATE = 96000
PAYLOAD_TYPE = 97
# Chunks that arrive within this of where the previous one ended are laid end to end (event-loop and
# network jitter measured here: a few ms, 20 ms at worst under load).
CONTINUITY_S = 0.03
# A chunk due earlier than where the stream already is by more than this has the overlap cut off; within
# it, it is laid end to end (a few ms late at most, below what viewers notice).
EARLY_TOLERANCE_S = 0.005
# No audio for this long: silence is sent in its place (a few chunks, so a late chunk still fits in).
SILENCE_AFTER_S = 0.1
# Audio waiting for a stream that does not play is dropped beyond this.
MAX_QUEUED_S = 0.3


def audio_launch_fragment() -> str:
    """The audio half of a path's launch line (its payloader is the media's second stream, `pay1`)."""
    caps = f"audio/x-raw,format=S16LE,layout=interleaved,rate={RATE},channels={CHANNELS}"
    return (
        f"appsrc name=asrc is-live=true do-timestamp=false format=time caps={caps} "
        f"! opusenc name=aenc bitrate={OPUS_BITRATE} frame-size=20 "
        f"! rtpopuspay name=pay1 pt={PAYLOAD_TYPE}"
    )


class PcmConverter:
    """Any `av.AudioFrame` to 48 kHz interleaved stereo S16 bytes."""

    def __init__(self) -> None:
        self._resampler: av.AudioResampler | None = None
        self._input: tuple[str, str, int] | None = None

    def __call__(self, frame: av.AudioFrame) -> bytes:
        kind = (frame.format.name, frame.layout.name, frame.sample_rate)
        if kind == ("s16", "stereo", RATE):
            return bytes(frame.to_ndarray().tobytes())
        if self._resampler is None or kind != self._input:
            self._resampler = av.AudioResampler(format="s16", layout="stereo", rate=RATE)
            self._input = kind
        frame.pts = None  # the resampler would otherwise try to follow the caller's timestamps
        out = self._resampler.resample(frame)
        return b"".join(bytes(f.to_ndarray().tobytes()) for f in out)


class AudioFeed(AppsrcFeeder[tuple[Any, list[tuple[float, bytes]], bool]]):
    """The audio of one path: `offer` PCM chunks from any thread; a thread hands them to the media's appsrc.

    Counters (plain ints): ``chunks_in`` (offered), ``chunks_sent`` (handed to the encoder), ``silence_sent``
    (chunks of silence in the gaps), ``dropped`` (offered while no client plays, or too late), ``errors``.
    """

    what = "audio"

    def __init__(self, gst: Bindings, path: str, lead_s: Callable[[], float] = lambda: 0.0) -> None:
        """`lead_s`: how much earlier than their arrival chunks are stamped (to match how clients read the
        video's timestamps; see `RtspPublisher`)."""
        super().__init__(gst, path, f"rtsp-audio{path}")
        self._lead_s = lead_s
        self.chunks_in = 0
        self.chunks_sent = 0
        self.silence_sent = 0
        self.dropped = 0
        self.trimmed_ns = 0  # audio cut off chunks that overlapped what was already sent
        self._chunks: deque[tuple[float, bytes]] = deque()  # (monotonic time offered, PCM)
        self._prime = False
        self._watchers = 0
        self._next_pts: int | None = None  # where the last chunk sent ended, in running time (ns)
        self._last_audio: float | None = None  # monotonic time of the last chunk offered
        self._silence_due = 0.0  # monotonic time before which no silence is filled in again
        self._convert = PcmConverter()
        self._start_feeding()

    def offer(self, frame: av.AudioFrame, offered: float | None = None) -> None:
        """An audio frame due to play now (or at `offered`, a `time.monotonic()` instant)."""
        at = time.monotonic() if offered is None else offered
        with self._cond:
            self.chunks_in += 1
            if self._closed or self._appsrc is None or self._watchers == 0:
                self.dropped += 1
                return
        pcm = self._convert(frame)
        with self._cond:
            self._chunks.append((at, pcm))
            self._last_audio = at
            while self._chunks and at - self._chunks[0][0] > MAX_QUEUED_S:
                self._chunks.popleft()
                self.dropped += 1
            self._cond.notify()

    def set_watchers(self, count: int) -> None:
        with self._cond:
            self._watchers = count
            if count == 0:
                self.dropped += len(self._chunks)
                self._chunks.clear()
            self._cond.notify()

    def attach(self, appsrc: Any) -> None:
        with self._cond:
            if self._closed:
                return
            self._appsrc = appsrc
            self._prime = True  # the DESCRIBE waits for data on every stream
            self._next_pts = None
            self._cond.notify()

    def detach(self) -> None:
        with self._cond:
            self._appsrc = None
            self._chunks.clear()
            self._prime = False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._appsrc = None
            self._chunks.clear()
            self._cond.notify_all()

    # Feeder thread.
    def _next(self) -> tuple[Any, list[tuple[float, bytes]], bool] | None:
        """Wait for something to send: (appsrc, chunks, fill with silence); None once closed."""
        with self._cond:
            while not self._closed:
                appsrc = self._appsrc
                if appsrc is None:
                    self._cond.wait()
                    continue
                if self._chunks:
                    chunks = list(self._chunks)
                    self._chunks.clear()
                    self._prime = False
                    return appsrc, chunks, False
                if self._prime:
                    self._prime = False
                    return appsrc, [], True
                if self._watchers == 0:
                    self._cond.wait()
                    continue
                quiet_since = self._last_audio if self._last_audio is not None else 0.0
                due = max(quiet_since + SILENCE_AFTER_S, self._silence_due)
                wait = due - time.monotonic()
                if wait > 0:
                    self._cond.wait(min(wait, CHUNK_SAMPLES / RATE))
                    continue
                # Each fill reaches half a chunk ahead: the next is due a chunk later, not at once (which spun
                # this thread at a third of a core for every quiet path with a client).
                self._silence_due = time.monotonic() + CHUNK_SAMPLES / RATE
                return appsrc, [], True
            return None

    def _send(self, item: tuple[Any, list[tuple[float, bytes]], bool]) -> None:
        appsrc, chunks, silence = item
        if not self._wait_playing(appsrc):
            return
        now = time.monotonic()
        running = running_time_ns(appsrc, now)
        if running is None:
            return
        running -= int(self._lead_s() * NS)
        if silence:
            self._fill_silence(appsrc, running)
        for offered, pcm in chunks:
            if self._push(appsrc, pcm, running - int((now - offered) * NS)):
                self.chunks_sent += 1

    def _fill_silence(self, appsrc: Any, running: int) -> None:
        """Silence up to about now (one chunk to start a stream), kept just behind so real audio fits after."""
        chunk_ns = CHUNK_SAMPLES * NS // RATE
        start = self._next_pts if self._next_pts is not None else running - chunk_ns
        if running - start > 1 * NS:  # a long pause: start again from now rather than catch up
            start = running - chunk_ns
        silence = bytes(CHUNK_SAMPLES * BYTES_PER_SAMPLE)
        pts = start
        while pts + chunk_ns <= running + chunk_ns // 2:
            self._push(appsrc, silence, pts)
            self.silence_sent += 1
            pts += chunk_ns

    def _push(self, appsrc: Any, pcm: bytes, pts: int) -> bool:
        """Send `pcm` at `pts`, or end to end with what was sent when that is close; False when it is dropped.

        A chunk that arrives a little late is laid end to end (the encoder wants a continuous signal). One
        that is due before where the stream already is has its overlap cut off, and is dropped when nothing
        is left: laying it end to end instead would leave every later chunk out of sync by the overlap, for
        good, since a continuous run can only be pushed later, never earlier (silence filled in while the
        caller stalled, or a run that began on a late chunk)."""
        Gst = self._gst.Gst
        if self._next_pts is not None:
            overlap = self._next_pts - pts
            if overlap > int(EARLY_TOLERANCE_S * NS):
                cut = (overlap * RATE // NS) * BYTES_PER_SAMPLE
                if cut >= len(pcm):
                    self.dropped += 1
                    return False
                pcm = pcm[cut:]
                self.trimmed_ns += overlap
            if -int(CONTINUITY_S * NS) < overlap:
                pts = self._next_pts  # end to end (never overlapping what was sent)
        duration = len(pcm) // BYTES_PER_SAMPLE * NS // RATE
        buffer = Gst.Buffer.new_wrapped(pcm)
        buffer.pts = max(0, pts)
        buffer.duration = duration
        appsrc.emit("push-buffer", buffer)
        self._next_pts = buffer.pts + duration
        return True
