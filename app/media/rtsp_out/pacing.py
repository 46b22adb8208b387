"""When a path's feeder sends its last frame again, and which frames it makes keyframes.

Timestamps follow the frames actually produced (the appsrc stamps each one on arrival), so a producer
that makes 12 frames a second is sent at 12 frames a second: a client sees every frame once. The last
frame is sent again only

* while the producer pauses: no new frame for `PAUSE_GAPS` of its own recent frame intervals (at least
  `PAUSE_MIN_S`), then at the announced rate, as a camera would, so clients' read timeouts do not fire
  and a client that connects meanwhile can open the stream;
* while a client that just started playing probes the stream: FFmpeg (OBS's media source, ffmpeg,
  PyAV) returns from opening an RTSP stream only after it has seen `FFMPEG_PROBE_FRAMES` frames, whatever
  the SDP announces (libavformat's `avformat_find_stream_info` needs 20 frame durations when the time base
  is the 90 kHz RTP clock), so for the first `PROBE_FRAMES` frames after a client starts, gaps longer than
  one announced frame interval are filled. With a 12 fps producer this takes opening from ~1.7 s to ~0.8 s.

Keyframes: the first frame a client gets, the frames just after FFmpeg's probing ends (a client that drops
what it read while probing, `fflags=nobuffer`, can decode only from a keyframe on), and at least every
`KEYFRAME_INTERVAL_S` whatever the producer's rate (x264's own interval counts frames, which a slow
producer stretches).

Pure bookkeeping, no GStreamer: the feeder tells it what it sent and asks what is due.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FFMPEG_PROBE_FRAMES = 20
# Frames after a client starts during which gaps are filled. PyAV with `fflags=nobuffer` was measured
# returning from `av.open` after 21-27 frames (RTP reordering and the first timestamps take a few more).
PROBE_FRAMES = FFMPEG_PROBE_FRAMES + 16
# Frames, counted from a client's start, that are made keyframes: its first, then every fourth from where
# the shortest probing ends to where the longest measured does (an I-frame costs ~6 P-frames at 640x480).
KEYFRAME_FRAMES_AFTER_PLAY = (0, *range(FFMPEG_PROBE_FRAMES + 1, PROBE_FRAMES + 1, 4))
KEYFRAME_INTERVAL_S = 2.0
PAUSE_GAPS = 3.0
PAUSE_MIN_S = 0.25
PAUSE_MAX_S = 2.0
# Weight of the newest interval in the producer's mean frame interval.
GAP_SMOOTHING = 0.1


@dataclass
class Pacing:
    """What the feeder of one path has sent, and what that makes due. Times are `time.monotonic()`."""

    fps: int
    keyframe_interval_s: float = KEYFRAME_INTERVAL_S  # the encoder policy's (app.media.encoder)
    frames_sent: int = 0  # fresh and repeated
    mean_gap_s: float | None = None  # between fresh frames
    _last_sent_at: float | None = None
    _last_fresh_at: float | None = None
    _last_was_fresh: bool = False
    _probe_until: int = 0  # frames_sent below which gaps are filled
    _keyframes_at: set[int] = field(default_factory=set)
    _last_keyframe_at: float | None = None

    @property
    def interval_s(self) -> float:
        return 1.0 / self.fps

    @property
    def probing(self) -> bool:
        return self.frames_sent < self._probe_until

    def pause_after_s(self) -> float:
        """How long without a new frame counts as a pause of the producer."""
        if self.mean_gap_s is None:
            return PAUSE_MIN_S
        return min(PAUSE_MAX_S, max(PAUSE_MIN_S, PAUSE_GAPS * self.mean_gap_s))

    def client_started(self) -> None:
        """A client started playing: fill gaps while it probes, and keyframes where it needs them."""
        self._probe_until = self.frames_sent + PROBE_FRAMES
        self._keyframes_at |= {self.frames_sent + k for k in KEYFRAME_FRAMES_AFTER_PLAY}

    def stream_started(self) -> None:
        """A new media starts: its first frame must be a keyframe; what the producer did stays known."""
        self._keyframes_at.add(self.frames_sent)
        self._last_sent_at = None

    def keyframe_due(self, now: float) -> bool:
        """Whether the frame about to be sent should be a keyframe."""
        if self.frames_sent in self._keyframes_at:
            return True
        return self._last_keyframe_at is not None and now - self._last_keyframe_at >= self.keyframe_interval_s

    def sent(self, now: float, *, fresh: bool, keyframe: bool) -> None:
        if fresh:
            if self._last_fresh_at is not None:
                gap = now - self._last_fresh_at
                self.mean_gap_s = (
                    gap if self.mean_gap_s is None else self.mean_gap_s + GAP_SMOOTHING * (gap - self.mean_gap_s)
                )
            self._last_fresh_at = now
        if keyframe or self._last_keyframe_at is None:
            self._last_keyframe_at = now
        self._keyframes_at = {k for k in self._keyframes_at if k > self.frames_sent}
        self.frames_sent += 1
        self._last_sent_at = now
        self._last_was_fresh = fresh

    def repeat_at(self) -> float | None:
        """When to send the last frame again if no new one comes first; None before anything was sent."""
        if self._last_sent_at is None:
            return None
        if self.probing or not self._last_was_fresh:
            return self._last_sent_at + self.interval_s
        base = self._last_fresh_at if self._last_fresh_at is not None else self._last_sent_at
        return base + self.pause_after_s()
