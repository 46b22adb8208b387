"""Feeding a path: the H.264 access units of its `SharedEncode`, as they are, into

    appsrc (H.264 byte-stream, one access unit per buffer) → rtph264pay

The path encodes nothing itself: the output's picture is encoded once, and the RTSP path is one more reader of
that encode. `config-interval=1` repeats SPS/PPS every second in the RTP stream.

Each access unit is stamped with the running time at which the output handed its frame to the encode, not when it
arrived here: the path's sound is stamped by when it is due (`audio_feed`), and the encode, the hand-overs
between threads and the feeder's queue take a time that grows with the machine's load, which stamping on arrival
would put between the picture and its sound.

FFmpeg-based clients (OBS's media source, ffmpeg, PyAV) find the end of an H.264 frame only when the next NAL that
cannot belong to it arrives, which normally is the next frame: one frame interval of delay on top of everything
else. So each access unit is followed at once by an access unit delimiter, which tells those parsers the frame is
complete (measured over loopback at 640x480@30: push-to-decoded latency from ~37 ms to ~4 ms). FFmpeg's parser then
gives each access unit the timestamp of the packet it started in, one frame interval early, which the path's Opus
stream makes up for (`frame_interval_s`, the recent interval between access units).

Demand: the feed is a reader of the encode only while the path needs packets, so nothing is encoded for a path
nobody watches. It needs them while a client plays it, while a new media waits for its first keyframe (a
client's DESCRIBE is answered once the media has had data), and for `PLAY_GRACE_S` after that, so that the
PLAY that normally follows a DESCRIBE finds the encode still running rather than restarting it.

Keyframes: a media's first buffer is a keyframe (packets before it are skipped), and so is the first after
packets were dropped. A new media and each client that starts playing ask the encode for one, and again once
FFmpeg's probing is over (`pacing`): a client that drops what it read while probing (`fflags=nobuffer`) can
decode only from a keyframe on. The encode spaces requested keyframes itself.

Opening: FFmpeg returns from opening an RTSP stream only after it has seen about `FFMPEG_PROBE_FRAMES` frames,
whatever the SDP announces (libavformat's `avformat_find_stream_info` needs 20 frame durations when the time base
is the 90 kHz RTP clock). A client that starts playing asks the path's feed for `PROBE_FRAMES` frames at the full
rate (`SharedEncode.probe`), so a slow producer's stream opens in about one second rather than in 20 of its own
frame intervals.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import TYPE_CHECKING, Any

from app.egress.rtsp.appsrc_feeder import AppsrcFeeder, running_time_ns
from app.egress.rtsp.bindings import Bindings

if TYPE_CHECKING:
    from app.egress.encode import EncodedPacket, SharedEncode

# An H.264 access unit delimiter NAL (primary_pic_type 7: any slice type), with its start code.
AUD = b"\x00\x00\x00\x01\x09\xf0"
FFMPEG_PROBE_FRAMES = 20
# Frames after a client starts that come at the full rate. PyAV with `fflags=nobuffer` was measured returning
# from `av.open` after 21-27 frames (RTP reordering and the first timestamps take a few more).
PROBE_FRAMES = FFMPEG_PROBE_FRAMES + 16
# Weight of the newest interval in the mean interval between access units.
GAP_SMOOTHING = 0.1
# Access units waiting for the feeder thread; when it falls this far behind, all are dropped (newest wins).
MAX_QUEUED = 8
# How long after a media's first keyframe the encode keeps running for a client to start playing.
PLAY_GRACE_S = 5.0


def packet_launch_description(width: int, height: int, fps: int) -> str:
    """The gst-rtsp-server launch line of a packet-fed path's media (its video part)."""
    caps = f"video/x-h264,stream-format=byte-stream,alignment=au,width={width},height={height},framerate={fps}/1"
    return (
        f"( appsrc name=src is-live=true do-timestamp=false format=time caps={caps} "
        f"! rtph264pay name=pay0 pt=96 config-interval=1 )"
    )


class PacketFeed(AppsrcFeeder[tuple["EncodedPacket", Any]]):
    """One path as a reader of `encode` (`audio_codec` None: video packets only).

    Counters (plain ints, read without locking): ``packets_in`` (video packets the encode handed over while a
    media was there), ``packets_sent`` (into the appsrc), ``skipped`` (waiting for a keyframe), ``dropped``
    (the feeder thread fell behind), ``errors``.
    """

    what = "packets"
    audio_codec: str | None = None

    def __init__(self, gst: Bindings, path: str, encode: SharedEncode) -> None:
        super().__init__(gst, path, f"rtsp-packets{path}")
        self.encode = encode
        self.fps = encode.fps
        self.packets_in = 0
        self.packets_sent = 0
        self.skipped = 0
        self.dropped = 0
        self._queue: collections.deque[tuple[EncodedPacket, Any]] = collections.deque()
        self._need_keyframe = True
        self._priming = False  # the current media has not had its first keyframe yet
        self._grace_until: float | None = None
        self._keyframe_at: float | None = None  # when to ask the encode for a keyframe (feeder thread)
        self._watchers = 0
        # Attaching to and detaching from the encode happen under this lock, never under `_cond`: the encode
        # calls `packet` (which takes `_cond`) from its own thread.
        self._demand = threading.Lock()
        self._reading = False
        self._last_pts_us: int | None = None
        self._mean_gap_s: float | None = None
        self._stamped_on: Any = None  # the appsrc the last buffer went to, and its running time (feeder thread)
        self._last_stamp = 0
        self._start_feeding()

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def reading(self) -> bool:
        """Whether the feed is attached to the encode."""
        return self._reading

    @property
    def streaming(self) -> bool:
        return self._watchers > 0 and self._appsrc is not None

    def frame_interval_s(self) -> float:
        """The recent mean interval between access units (the path's rate until they flow)."""
        gap = self._mean_gap_s
        return gap if gap is not None else 1.0 / self.fps

    # ------------------------------------------------------------------------------ the encode's thread

    def packet(self, packet: EncodedPacket) -> None:
        """An encoded packet; never blocks (kept for the feeder thread, or dropped)."""
        if not packet.video:
            return
        with self._cond:
            if self._closed or self._appsrc is None:
                return
            self.packets_in += 1
            self._measure(packet.pts_us)
            if self._need_keyframe and not packet.keyframe:
                self.skipped += 1
                return
            if len(self._queue) >= MAX_QUEUED:
                self.dropped += len(self._queue)
                self._queue.clear()
                if not packet.keyframe:  # what follows refers to what was dropped
                    self.dropped += 1
                    self._need_keyframe = True
                    self._keyframe_at = time.monotonic()
                    self._cond.notify()
                    return
            self._need_keyframe = False
            self._queue.append((packet, self._appsrc))
            self._cond.notify()

    def _measure(self, pts_us: int) -> None:
        last, self._last_pts_us = self._last_pts_us, pts_us
        if last is None or not 0 < pts_us - last < 2_000_000:  # the encode restarted, or stalled: not a rate
            return
        gap = (pts_us - last) / 1_000_000
        mean = self._mean_gap_s
        self._mean_gap_s = gap if mean is None else mean + GAP_SMOOTHING * (gap - mean)

    # ------------------------------------------------------------------------------ the publisher

    def set_watchers(self, count: int) -> None:
        with self._cond:
            self._watchers = count
            if count > 0:
                self._grace_until = None
        self._update_demand()

    def client_started(self) -> None:
        """A client started playing: a keyframe now, frames at the full rate while it probes, and another
        keyframe once FFmpeg's probing is over."""
        self.encode.keyframe()
        self.encode.probe(PROBE_FRAMES)
        with self._cond:
            self._keyframe_at = time.monotonic() + (FFMPEG_PROBE_FRAMES + 1) / self.fps
            self._cond.notify()

    def attach(self, appsrc: Any, _encoder: Any = None) -> bool:
        """Feed this media from its first keyframe on; False once closed."""
        with self._cond:
            if self._closed:
                return False
            self._appsrc = appsrc
            self._queue.clear()
            self._need_keyframe = self._priming = True
            self._grace_until = None
            self._cond.notify()
        self._update_demand()
        self.encode.keyframe()
        return True

    def detach(self) -> None:
        with self._cond:
            self._appsrc = None
            self._queue.clear()
            self._priming = False
            self._grace_until = None
        self._update_demand()

    def request_keyframe(self) -> None:
        self.encode.keyframe()

    def close(self) -> bool:
        """Stop feeding and reading the encode; False when it was already closed."""
        with self._cond:
            if self._closed:
                return False
            self._closed = True
            self._appsrc = None
            self._queue.clear()
            self._cond.notify_all()
        self._update_demand()
        return True

    def _update_demand(self) -> None:
        with self._demand:
            with self._cond:
                grace = self._grace_until is not None and time.monotonic() < self._grace_until
                wanted = not self._closed and (self._watchers > 0 or self._priming or grace)
                if wanted and not self._reading:
                    self._need_keyframe = True
            if wanted and not self._reading:
                self.encode.attach(self)  # asks for a keyframe
            elif not wanted and self._reading:
                self.encode.detach(self)
            self._reading = wanted

    # ------------------------------------------------------------------------------ the feeder thread

    def _next(self) -> tuple[EncodedPacket, Any] | None:
        while True:
            ask = recheck = False
            with self._cond:
                if self._closed:
                    return None
                now = time.monotonic()
                if self._keyframe_at is not None and now >= self._keyframe_at:
                    self._keyframe_at = None
                    ask = True
                elif self._grace_until is not None and now >= self._grace_until:
                    self._grace_until = None
                    recheck = True
                elif self._queue:
                    return self._queue.popleft()
                else:
                    due = [t for t in (self._keyframe_at, self._grace_until) if t is not None]
                    self._cond.wait(max(0.0, min(due) - now) if due else None)
            if ask:
                self.encode.keyframe()
            if recheck:
                self._update_demand()

    def _send(self, item: tuple[EncodedPacket, Any]) -> None:
        packet, appsrc = item
        if not self._wait_playing(appsrc):
            self._lost(appsrc)
            return
        handed_at = packet.handed_at if packet.handed_at is not None else time.monotonic()
        pts = running_time_ns(appsrc, handed_at)
        if pts is None:  # no clock: the media is going away
            self._lost(appsrc)
            return
        if appsrc is self._stamped_on and pts <= self._last_stamp:  # never back in time (the payloader needs it)
            pts = self._last_stamp + 1
        self._stamped_on, self._last_stamp = appsrc, max(0, pts)
        buffer = self._gst.Gst.Buffer.new_wrapped(packet.data + AUD)
        buffer.pts = buffer.dts = self._last_stamp
        try:
            appsrc.emit("push-buffer", buffer)
        except Exception:
            self._lost(appsrc)
            raise
        self.packets_sent += 1
        primed = False
        with self._cond:
            if self._priming and self._appsrc is appsrc:
                self._priming, primed = False, True
                self._grace_until = time.monotonic() + PLAY_GRACE_S
                self._cond.notify()
        if primed:
            self._update_demand()

    def _lost(self, appsrc: Any) -> None:
        """A packet did not reach `appsrc`: what follows needs a keyframe first."""
        with self._cond:
            self.dropped += 1
            if self._appsrc is appsrc:
                self._queue.clear()
                self._need_keyframe = True
                self._keyframe_at = time.monotonic()
