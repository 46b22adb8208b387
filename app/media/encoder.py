"""swapcast's H.264 encoding policy, one for every live encode: live-use x264 settings, a bitrate band per
resolution, a fixed keyframe interval, and NVENC where FFmpeg can open it, with libx264 as the fallback.

`EncoderPolicy` opens the PyAV codecs of the WebRTC return path (through aiortc, below) and of the shared
encodes (`app.egress.encode`: one per output path, read by its RTSP clients, WHEP viewers, SRT callers and
pushes; and a WHEP hub's own where its output has no path yet). The shared encodes have no receiver estimate:
they run at a fixed rate inside the band, with their own preset (`shared_x264_preset`).

aiortc's encoder runs libx264 with its default preset (`medium`) and clamps every stream to 0.5-3 Mbit/s;
this one keeps aiortc's packetisation (the subclass only replaces how the codec is opened and fed) and takes
its settings from `EncoderSettings`. `configure_encoders` sets them for this process; aiortc's senders get
the encoder through `create_encoder` (installed by `install_timed_encoders`).

A change of the receiver's estimate (REMB) reopens the codec, as in aiortc (setting the open context's
bit_rate changed nothing in libx264's output: FFmpeg 8.1 through PyAV 16), but only past 25% rather than
10%: each reopen starts with a keyframe, a burst of bits. An estimate below the band's minimum is followed
down to `estimate_floor` of it: under a cap below the minimum, a stream held at the minimum only fills the
bottleneck's queue. Keyframes the receiver asks for leave at most once per `keyframe_min_interval_s` (a request
within it is answered when it ends): each is a burst, and under a cap a burst that overflows the queue makes
the receiver ask again.

For a receiver that cannot ask for lost packets (no NACK negotiated; app.media.sender_recovery says so through
`keyframes_under_loss`), a keyframe leaves at least every half second while its receiver reports show loss.

With `loss_control` on, from the client's first receiver report the rate is also the loss-based one
(app.media.loss_control, fed by app.media.sender_feedback): never over the estimate, down on heavy loss, less
what retransmissions send. A fall past 10% then reopens the codec (a rise, as before, past 25%): under a cap
every second spent over it fills the bottleneck's queue.
"""

from __future__ import annotations

import fractions
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import av
from aiortc.codecs import get_encoder as aiortc_encoder
from aiortc.codecs.h264 import H264Encoder
from av.video.codeccontext import VideoCodecContext

from app.media.hops import TimedEncoder
from app.media.loss_control import LossController
from app.settings import EncoderSettings

log = logging.getLogger(__name__)

FRAME_RATE = 30  # aiortc's frame clock for H.264 (its MAX_FRAME_RATE); the keyframe interval counts frames of it
X264 = "libx264"
NVENC = "h264_nvenc"
REOPEN_CHANGE = 0.25  # relative rise of the target bitrate that reopens the codec
REOPEN_FALL = 0.10  # relative fall that does
# A session's encode holds this many seconds of its rate in the rate control's buffer: no frame, a keyframe
# included, is much larger. A keyframe that does not fit a bottleneck's queue loses packets, and the receiver
# asks for another (libwebrtc's VP8 holds a keyframe to 3 average frames; this is 6 at 30 fps).
SESSION_BUFFER_S = 0.2
# A receiver that cannot ask for lost packets (no NACK negotiated) is sent a keyframe at least every
# `loss_keyframe_interval_s` while its receiver reports show loss, and for this long after the last such report.
LOSS_KEYFRAME_WHILE_S = 2.0


@dataclass(frozen=True)
class BitrateBand:
    min_bps: int
    max_bps: int

    def clamp(self, bps: int, floor: float = 1.0) -> int:
        """`bps` inside the band, or down to `floor` of its minimum."""
        return max(round(self.min_bps * floor), min(bps, self.max_bps))


def bitrate_band(width: int, height: int, settings: EncoderSettings) -> BitrateBand:
    """The band of the smallest configured height at least the frame's (the largest band for taller frames).
    The shorter side counts, so a portrait 720x1280 camera gets the 720p band."""
    side = min(width, height)
    bands = sorted(settings.bitrate_kbps.items())
    low, high = next((band for limit, band in bands if side <= limit), bands[-1][1])
    return BitrateBand(low * 1000, high * 1000)


class EncoderOpenError(Exception):
    """No configured encoder could be opened for this stream."""


def open_codec(
    name: str,
    width: int,
    height: int,
    bitrate: int,
    band: BitrateBand,
    settings: EncoderSettings,
    time_base: fractions.Fraction = fractions.Fraction(1, FRAME_RATE),
    buffer_s: float | None = None,
) -> VideoCodecContext:
    """An opened H.264 encoder context; raises what FFmpeg raises when the encoder cannot be opened.

    The average rate (`bitrate`) follows the receiver later; the peak rate is the band's maximum, with a
    buffer of `buffer_s` of the average rate (a keyframe is at most about that), or half a second of the peak
    without it. `time_base` is the frames' own (aiortc's counts frames; WHEP's is the RTP clock)."""
    codec = av.CodecContext.create(name, "w")
    assert isinstance(codec, VideoCodecContext)
    configure_codec(codec, width, height, bitrate, band, settings, time_base, buffer_s)
    codec.open()
    return codec


def configure_codec(
    codec: VideoCodecContext,
    width: int,
    height: int,
    bitrate: int,
    band: BitrateBand,
    settings: EncoderSettings,
    time_base: fractions.Fraction,
    buffer_s: float | None = None,
) -> None:
    """`open_codec`'s settings on a context not yet opened (a muxer's stream's, which the muxer opens)."""
    name = codec.name
    codec.width = width
    codec.height = height
    codec.pix_fmt = "yuv420p"
    codec.framerate = fractions.Fraction(FRAME_RATE, 1)
    codec.time_base = time_base
    codec.bit_rate = bitrate
    codec.gop_size = max(1, round(settings.keyframe_interval_s * FRAME_RATE))
    codec.max_b_frames = 0  # every frame is sent as soon as it is encoded
    codec.thread_count = settings.threads
    buffer = round(bitrate * buffer_s) if buffer_s is not None else band.max_bps // 2
    peak = {"maxrate": str(band.max_bps), "bufsize": str(buffer)}
    if name == NVENC:
        codec.options = {
            "preset": settings.nvenc_preset,
            "tune": "ull",
            "rc": "cbr",
            "zerolatency": "1",
            "delay": "0",
            "forced-idr": "1",
            "profile": "baseline",
            **peak,
        }
    else:
        options = {"preset": settings.x264_preset, "level": "31", "forced-idr": "1", **peak}
        if settings.x264_tune:
            options["tune"] = settings.x264_tune
        codec.options = options
        codec.profile = "Baseline"  # what aiortc offers (42e01f); a browser may decode nothing else


_nvenc_lock = threading.Lock()
_nvenc_failed: str | None = None  # why NVENC did not open in this process (auto: not tried again)


def _open_best(settings: EncoderSettings, open_as: Callable[[str], VideoCodecContext]) -> VideoCodecContext:
    """`open_as` the encoder `settings.backend` picks: NVENC while it can open (under auto, until it once did
    not), else libx264."""
    global _nvenc_failed
    if settings.backend in ("auto", "nvenc"):
        with _nvenc_lock:
            failed = _nvenc_failed if settings.backend == "auto" else None
        if failed is None:
            try:
                return open_as(NVENC)
            except Exception as exc:  # no GPU, no driver, or no free NVENC session: libx264 takes over
                with _nvenc_lock:
                    first = _nvenc_failed is None
                    _nvenc_failed = str(exc) or type(exc).__name__
                if settings.backend == "nvenc":  # asked for: worth a warning each time
                    log.warning("NVENC is not available (%s); encoding with libx264", _nvenc_failed)
                elif first:
                    log.info("NVENC is not available (%s); encoding with libx264", _nvenc_failed)
    return open_as(X264)


def nvenc_failure() -> str | None:
    """Why NVENC could not be opened in this process, if it was tried and failed."""
    with _nvenc_lock:
        return _nvenc_failed


class LiveH264Encoder(H264Encoder):
    """aiortc's H.264 encoder with swapcast's settings (see the module docstring)."""

    def __init__(self, settings: EncoderSettings, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.settings = settings
        self._clock = clock
        self._requested: int | None = None  # the receiver's estimate; None until one arrives
        self._band: BitrateBand | None = None
        self._last_forced: float | None = None  # when the last requested keyframe was encoded (monotonic)
        self._keyframe_owed = False
        self.keyframes_forced = 0  # requested keyframes encoded
        self.keyframes_deferred = 0
        self.keyframes_encoded = 0  # every keyframe, the scheduled ones included
        self.keyframes_for_loss = 0
        # Set (`keyframes_under_loss`) for a receiver that cannot ask for lost packets: then a keyframe at least
        # this often while it reports loss, so that no loss stays on its screen longer.
        self.loss_keyframe_interval_s: float | None = None
        self._loss_reported_at: float | None = None
        self._last_keyframe_at: float | None = None
        # The loss-based rate (settings.loss_control), made by the first receiver report (`_loss_control`).
        self.loss_control: LossController | None = None
        self._loss_lock = threading.Lock()  # reports arrive on the event loop, frames encode in a thread

    @property
    def backend(self) -> str | None:
        """The FFmpeg encoder in use (h264_nvenc or libx264); None before the first frame."""
        return self.codec.name if self.codec is not None else None

    @property
    def target_bitrate(self) -> int:
        """Bits per second: the receiver's estimate inside this resolution's band, or down to `estimate_floor`
        of its minimum (the minimum until an estimate arrives)."""
        if self._band is None:
            return self._requested or 0
        requested = self._requested if self._requested is not None else self._band.min_bps
        with self._loss_lock:
            if self.loss_control is not None:
                requested = min(requested, self.loss_control.target_bps(time.monotonic()))
        return self._band.clamp(requested, self.settings.estimate_floor)

    @target_bitrate.setter
    def target_bitrate(self, bitrate: int) -> None:
        self._requested = int(bitrate)
        with self._loss_lock:
            if self.loss_control is not None:
                self.loss_control.on_estimate(self._requested)

    def keyframes_under_loss(self, interval_s: float | None) -> None:
        """A keyframe at least every `interval_s` while the receiver reports loss (None: only as scheduled)."""
        self.loss_keyframe_interval_s = interval_s

    def report_loss(self, fraction_lost: float, now: float) -> None:
        """A receiver report's share lost (0-1): the loss-based rate's input (nothing with it off), and what
        keeps keyframes frequent for a receiver that cannot ask for lost packets."""
        if fraction_lost > 0:
            self._loss_reported_at = now
        control = self._loss_control()
        if control is not None:
            with self._loss_lock:
                control.on_report(fraction_lost, now)

    def report_retransmitted(self, nbytes: int, now: float) -> None:
        control = self._loss_control()
        if control is not None:
            with self._loss_lock:
                control.on_retransmitted(nbytes, now)

    def rate_stats(self) -> dict[str, Any]:
        """The return rate: the target and, with loss control, what it decided last and why."""
        stats: dict[str, Any] = {"target_bps": self.target_bitrate, "loss_control": self.settings.loss_control}
        with self._loss_lock:
            if self.loss_control is not None:
                decided = self.loss_control.stats(time.monotonic())
                stats |= {k: v for k, v in decided.items() if k != "target_bps"}
        return stats

    def _loss_control(self) -> LossController | None:
        """The loss-based rate, started (from the current target) by the first report once the band is known:
        a sender nobody reports on (the bench's client) follows the estimate alone, as with it off."""
        if self.loss_control is None and self.settings.loss_control and self._band is not None:
            band = self._band
            floor = round(band.min_bps * self.settings.estimate_floor)
            control = LossController(self.target_bitrate, floor, band.max_bps)
            if self._requested is not None:
                control.on_estimate(self._requested)
            self.loss_control = control
        return self.loss_control

    def _reopen_due(self, frame: av.VideoFrame) -> bool:
        """A new size, or a target that rose past REOPEN_CHANGE of the codec's rate or fell past REOPEN_FALL
        (REOPEN_CHANGE without loss control, as before it)."""
        assert self.codec is not None
        if frame.width != self.codec.width or frame.height != self.codec.height:
            return True
        current = self.codec.bit_rate or 0
        target = self.target_bitrate
        fall = REOPEN_FALL if self.loss_control is not None else REOPEN_CHANGE
        return target > current * (1 + REOPEN_CHANGE) or target < current * (1 - fall)

    def _encode_frame(self, frame: av.VideoFrame, force_keyframe: bool) -> Iterator[bytes]:
        if self.codec is not None and self._reopen_due(frame):
            self.buffer_data = b""
            self.buffer_pts = None
            self.codec = None
        if self.codec is None:
            self._band = band = bitrate_band(frame.width, frame.height, self.settings)
            width, height, bitrate = frame.width, frame.height, self.target_bitrate
            self.codec = _open_best(
                self.settings,
                lambda name: open_codec(name, width, height, bitrate, band, self.settings, buffer_s=SESSION_BUFFER_S),
            )
        # aiortc's way: a forced keyframe on the receiver's request (PLI/FIR), otherwise the encoder decides.
        now = self._clock()
        force_keyframe = self._keyframe_due(force_keyframe, now)
        if not force_keyframe and self._loss_keyframe_due(now):
            force_keyframe = True
            self.keyframes_for_loss += 1
        frame.pict_type = av.video.frame.PictureType.I if force_keyframe else av.video.frame.PictureType.NONE
        packets = self.codec.encode(frame)
        if any(packet.is_keyframe for packet in packets):
            self._last_keyframe_at = now
            self.keyframes_encoded += 1
        data = b"".join(bytes(packet) for packet in packets)
        if data:
            yield from self._split_bitstream(data)

    def _keyframe_due(self, requested: bool, now: float | None = None) -> bool:
        """Whether this frame is a requested keyframe: one per `keyframe_min_interval_s`; a request within the
        interval is owed until it ends."""
        now = self._clock() if now is None else now
        owed = requested or self._keyframe_owed
        if not owed:
            return False
        if self._last_forced is not None and now - self._last_forced < self.settings.keyframe_min_interval_s:
            if requested:
                self.keyframes_deferred += 1
            self._keyframe_owed = True
            return False
        self._last_forced, self._keyframe_owed = now, False
        self.keyframes_forced += 1
        return True

    def _loss_keyframe_due(self, now: float) -> bool:
        """Whether a receiver that cannot ask for lost packets, and reported loss lately, is owed a keyframe."""
        interval, lossy = self.loss_keyframe_interval_s, self._loss_reported_at
        if interval is None or lossy is None or now - lossy > LOSS_KEYFRAME_WHILE_S:
            return False
        return self._last_keyframe_at is None or now - self._last_keyframe_at >= interval


_settings = EncoderSettings()
_settings_lock = threading.Lock()


def configure_encoders(settings: EncoderSettings) -> None:
    """The settings every encoder created from now on in this process uses."""
    global _settings
    with _settings_lock:
        _settings = settings


def encoder_settings() -> EncoderSettings:
    """The settings this process's encoders use (`configure_encoders`)."""
    with _settings_lock:
        return _settings


def create_encoder(codec: Any) -> Any:
    """aiortc's `get_encoder`, with swapcast's H.264 encoder."""
    if codec.mimeType.lower() == "video/h264":
        with _settings_lock:
            settings = _settings
        return LiveH264Encoder(settings)
    return aiortc_encoder(codec)


def shared_bitrate_bps(width: int, height: int, fps: int, settings: EncoderSettings) -> int:
    """A shared encode's fixed rate: about 0.1 bit per pixel (~0.9 Mbit/s at 640x480@30, ~2.8 at 720p30, ~6.2 at
    1080p30), inside the frame's band."""
    return bitrate_band(width, height, settings).clamp(round(width * height * fps * 0.1))


@dataclass(frozen=True)
class EncoderPolicy:
    """Every H.264 encode of the server, from one `EncoderSettings`."""

    settings: EncoderSettings

    @property
    def keyframe_interval_s(self) -> float:
        return self.settings.keyframe_interval_s

    def install(self) -> None:
        """aiortc's senders in this process encode with these settings (once, at server start-up)."""
        configure_encoders(self.settings)
        install_timed_encoders()

    def open_shared(self, width: int, height: int, time_base: fractions.Fraction) -> VideoCodecContext:
        """The WHEP hub's encode: NVENC or libx264 with the shared preset, at the shared fixed rate."""
        shared = self.settings.model_copy(update={"x264_preset": self.settings.shared_x264_preset})
        band = bitrate_band(width, height, self.settings)
        bitrate = shared_bitrate_bps(width, height, FRAME_RATE, shared)
        return _open_best(shared, lambda name: open_codec(name, width, height, bitrate, band, shared, time_base))

    def open_push(self, width: int, height: int, fps: int) -> VideoCodecContext:
        """A channel's encode for its pushes (`app.egress.encode`): NVENC where one opens at this size (under
        the settings' backend), else libx264 with the shared preset, at the shared fixed rate inside the band, one
        frame per tick of `fps`. Without a global header, so that every keyframe carries its SPS and PPS: a push
        that joins on one needs nothing sent before it."""
        shared = self.settings.model_copy(update={"x264_preset": self.settings.shared_x264_preset})
        band = bitrate_band(width, height, self.settings)
        bitrate = shared_bitrate_bps(width, height, fps, shared)

        def open_as(name: str) -> VideoCodecContext:
            codec = av.CodecContext.create(name, "w")
            assert isinstance(codec, VideoCodecContext)
            configure_codec(codec, width, height, bitrate, band, shared, fractions.Fraction(1, fps))
            codec.framerate = fractions.Fraction(fps, 1)
            codec.gop_size = max(1, round(self.settings.keyframe_interval_s * fps))
            codec.open()
            return codec

        return _open_best(self.settings, open_as)

    def shared_bitrate_kbps(self, width: int, height: int, fps: int) -> int:
        return round(shared_bitrate_bps(width, height, fps, self.settings) / 1000)


_installed = False
_install_lock = threading.Lock()


def install_timed_encoders() -> None:
    """Make aiortc's senders in this process use swapcast's encoders wrapped in `TimedEncoder`s (idempotent).
    Frames without an `EncodeCallback` are encoded exactly as before."""
    global _installed
    with _install_lock:
        if _installed:
            return
        from aiortc import rtcrtpsender

        def get_encoder(codec: Any) -> Any:
            encoder = create_encoder(codec)
            return TimedEncoder(encoder) if codec.mimeType.lower().startswith("video/") else encoder

        rtcrtpsender.get_encoder = get_encoder
        _installed = True
