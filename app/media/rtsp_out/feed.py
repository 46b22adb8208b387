"""Feeding one path's encoder: the newest frame pushed, as I420, into

    appsrc (live, timestamped on arrival) → x264enc (the encoder policy's shared settings) → rtph264pay

`config-interval=1` repeats SPS/PPS every second: with x264's sliced threads the alternative
(`-1`) gives clients corrupt frames.

FFmpeg-based clients (OBS's media source, ffmpeg, PyAV) find the end of an H.264 frame only when
the next NAL that cannot belong to it arrives, which normally is the next frame: one frame
interval (33 ms at 30 fps) of delay on top of everything else. So each encoded frame is followed
at once by an access unit delimiter (x264's own leading ones are switched off), which tells those
parsers the frame is complete. Measured over loopback at 640x480@30 this takes the push-to-decoded
latency from ~37 ms to ~4 ms; `aud_after_frame=False` turns it off.

While no client plays the path, frames pushed are dropped at once, before any conversion, and the
encoder is idle. A media answers a client's DESCRIBE only once its first frame is encoded, so a media
starts from the last frame pushed (black if there was none). When frames are sent again and which are
keyframes is `pacing`'s business: timestamps follow the frames produced, and repeats come only while
the producer pauses or a new client probes the stream.
"""

from __future__ import annotations

import time
from typing import Any

import cv2
import numpy as np
import numpy.typing as npt

from app.live.frame import OutputFrame, to_i420
from app.media.mailbox import Mailbox
from app.media.rtsp_out.appsrc_feeder import AppsrcFeeder
from app.media.rtsp_out.bindings import Bindings
from app.media.rtsp_out.pacing import Pacing

# Frames the appsrc may hold while the encoder is busy; older ones are dropped beyond that.
APPSRC_MAX_BUFFERS = 2

# An H.264 access unit delimiter NAL (primary_pic_type 7: any slice type), with its start code.
AUD = b"\x00\x00\x00\x01\x09\xf0"


def launch_description(width: int, height: int, fps: int, x264enc: str, aud_after_frame: bool) -> str:
    """The gst-rtsp-server launch line of one path's media; `x264enc`: the encoder's properties
    (`EncoderPolicy.x264enc_properties`)."""
    caps = f"video/x-raw,format=I420,width={width},height={height},framerate={fps}/1"
    return (
        f"( appsrc name=src is-live=true do-timestamp=true format=time "
        f"max-buffers={APPSRC_MAX_BUFFERS} leaky-type=downstream caps={caps} "
        f"! x264enc name=enc {x264enc} aud={'false' if aud_after_frame else 'true'} "
        f"! video/x-h264,stream-format=byte-stream,alignment=au,profile=constrained-baseline "
        f"! rtph264pay name=pay0 pt=96 config-interval=1 )"
    )


class AudAppender:
    """A pad probe that sends each encoded frame on with an access unit delimiter appended.

    One per media: the recursion guard relies on the pad having a single streaming thread."""

    def __init__(self, gst: Bindings) -> None:
        self._gst = gst
        self._inside = False

    def __call__(self, pad: Any, info: Any) -> Any:
        Gst = self._gst.Gst
        if self._inside:  # the buffer pushed below, coming through this probe again
            return Gst.PadProbeReturn.OK
        frame = info.get_buffer()
        ok, mapped = frame.map(Gst.MapFlags.READ)
        if not ok:
            return Gst.PadProbeReturn.OK
        try:
            data = bytes(mapped.data)
        finally:
            frame.unmap(mapped)
        out = Gst.Buffer.new_wrapped(data + AUD)
        out.pts, out.dts, out.duration = frame.pts, frame.dts, frame.duration
        out.set_flags(frame.get_flags())
        self._inside = True
        try:
            pad.push(out)
        finally:
            self._inside = False
        # DROP, not HANDLED: the pad unrefs the encoder's buffer only for DROP (HANDLED leaves that to the probe,
        # which Python cannot do), and every encoded frame of every played path would leak.
        return Gst.PadProbeReturn.DROP


class EncoderFeed(AppsrcFeeder[tuple[OutputFrame | None, bool, Any]]):
    """The feeder thread of one path and what it reads: the newest frame, the current media's appsrc and
    encoder, how many clients play, and the keyframes due.

    Counters (plain ints, read without locking): ``frames_pushed`` (every frame offered), ``frames_sent``
    (handed to the encoder), ``frames_repeated`` (sent but not fresh: a new media's first frame and repeats
    while no new frame comes), ``errors`` (frames that could not be converted or handed to the encoder,
    logged once); `dropped` counts frames replaced before the feeder took them (``superseded``) and frames
    pushed out of the appsrc's short queue while the encoder was busy (``encoder_busy``).
    """

    what = "frames"

    def __init__(self, gst: Bindings, path: str, width: int, height: int, fps: int, keyframe_interval_s: float) -> None:
        super().__init__(gst, path, f"rtsp-feed{path}")
        self.width = width
        self.height = height
        self.fps = fps
        self.frames_pushed = 0
        self.frames_sent = 0
        self.frames_repeated = 0
        self._frames: Mailbox[OutputFrame] = Mailbox(cond=self._cond)
        self._last: OutputFrame | None = None  # the newest frame pushed, streaming or not
        self._previous: bytes | None = None  # the last frame sent, as I420 (feeder thread only)
        self._prime = False  # a new media waits for its first frame
        self._encoder: Any = None
        self._watchers = 0  # clients playing the path
        self._pacing = Pacing(fps, keyframe_interval_s)  # read and written with `_cond` held
        self._start_feeding()

    @property
    def dropped(self) -> int:
        return self._frames.dropped

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def streaming(self) -> bool:
        return self._watchers > 0 and self._appsrc is not None

    def offer(self, frame: OutputFrame) -> None:
        """The newest frame; kept for the feeder only while a client plays the path."""
        with self._cond:
            self.frames_pushed += 1
            self._last = frame
            if self._watchers == 0 or self._appsrc is None or self._closed:
                return
            self._frames.put(frame)

    def frame_interval_s(self) -> float:
        """The producer's recent mean frame interval (the announced one until frames flow)."""
        with self._cond:
            gap = self._pacing.mean_gap_s
        return gap if gap is not None else 1.0 / self.fps

    def set_watchers(self, count: int) -> None:
        with self._cond:
            if self._watchers == 0 and count > 0:
                self._prime = True
            self._watchers = count
            if count == 0:
                self._frames.discard()
            self._cond.notify()

    def client_started(self) -> None:
        """A client started playing: keyframes where it needs them, gaps filled while it probes."""
        with self._cond:
            self._pacing.client_started()
            self._cond.notify()

    def attach(self, appsrc: Any, encoder: Any) -> bool:
        """Feed this media from now on, starting with the last frame; False once closed."""
        with self._cond:
            if self._closed:
                return False
            self._appsrc, self._encoder = appsrc, encoder
            self._pacing.stream_started()
            self._prime = True  # the media prepares (and the DESCRIBE returns) once a frame is encoded
            self._cond.notify()
            return True

    def detach(self) -> None:
        with self._cond:
            self._appsrc = self._encoder = None
            self._frames.discard()
            self._prime = False

    def request_keyframe(self) -> None:
        """Ask the encoder to make the next frame a keyframe (with SPS/PPS)."""
        encoder = self._encoder
        if encoder is None:
            return
        gst = self._gst
        event = gst.GstVideo.video_event_new_upstream_force_key_unit(gst.Gst.CLOCK_TIME_NONE, True, 0)
        encoder.get_static_pad("src").send_event(event)

    def close(self) -> bool:
        """Stop feeding; False when it was already closed."""
        with self._cond:
            if self._closed:
                return False
            self._closed = True
            self._frames.discard()
            self._cond.notify_all()
            return True

    # Feeder thread.
    def _next(self) -> tuple[OutputFrame | None, bool, Any] | None:
        """Wait for what to send next, or None once closed: (image, fresh, appsrc).

        `image` is None to send the previous frame again (when `pacing` says so); `fresh` is True
        for a frame from `offer`, False for the last or a black one that starts a stream."""
        with self._cond:
            while not self._closed:
                appsrc = self._appsrc
                repeat_at = self._pacing.repeat_at()
                if appsrc is None:
                    self._cond.wait()
                elif (image := self._frames.take()) is not None:
                    self._prime = False
                    return image, True, appsrc
                elif self._prime:
                    self._prime = False
                    return (self._last if self._last is not None else self._black()), False, appsrc
                elif self._watchers == 0 or repeat_at is None:
                    self._cond.wait()
                elif (wait := repeat_at - time.monotonic()) > 0:
                    self._cond.wait(wait)
                else:
                    return None, False, appsrc
            return None

    def _send(self, item: tuple[OutputFrame | None, bool, Any]) -> None:
        image, fresh, appsrc = item
        if image is not None:
            self._previous = self._to_i420(image).tobytes()
        if self._previous is None or not self._wait_playing(appsrc):
            return
        now = time.monotonic()
        with self._cond:
            keyframe = self._pacing.keyframe_due(now)
        if keyframe:
            self.request_keyframe()
        if appsrc.get_property("current-level-buffers") >= APPSRC_MAX_BUFFERS:
            self._frames.count_drop("encoder_busy")  # the appsrc drops its oldest to make room
        appsrc.emit("push-buffer", self._gst.Gst.Buffer.new_wrapped(self._previous))
        with self._cond:
            self._pacing.sent(now, fresh=fresh, keyframe=keyframe)
        if fresh:
            self.frames_sent += 1
        else:
            self.frames_repeated += 1

    def _black(self) -> OutputFrame:
        return OutputFrame(np.zeros((self.height, self.width, 3), np.uint8))

    def _to_i420(self, frame: OutputFrame) -> npt.NDArray[np.uint8]:
        """The frame's own I420 form when it has the path's size (shared with the other outputs), else its
        image resized and converted here."""
        w, h = frame.size
        if (w, h) == (self.width, self.height):
            return frame.i420()
        shrink = w * h > self.width * self.height
        sized = cv2.resize(
            frame.image, (self.width, self.height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
        )
        return to_i420(np.asarray(sized, np.uint8))
