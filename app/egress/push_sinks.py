"""Where a push's packets go: one muxer per destination kind, fed the channel's shared encode
(`app.egress.encode`): H.264, and AAC or Opus, muxed as they come, never encoded here.

- RTMP/RTMPS: FLV over FFmpeg's `rtmp`/`rtmps` protocol, H.264 + AAC.
- WHIP: FFmpeg's `whip` muxer (an HTTP offer with the Bearer token, then ICE, DTLS-SRTP), H.264 + Opus.
- SRT: MPEG-TS muxed by PyAV into GStreamer's `srtsink` (caller or listener, latency, passphrase), as the
  FFmpeg that PyAV bundles has no SRT protocol: `appsrc ! srtsink`.

A sink opens on the push's first packet, a keyframe: the H.264 stream takes its SPS and PPS from it (PyAV reads
them before it writes the header), and the sound's stream has an encoder of the same settings, opened and never
fed, which describes it to the muxer exactly as the channel's encoder would. Each call may block on the network
for up to `IO_TIMEOUT_S`; a sink that fails raises, and its push opens a new one after a pause.
"""

from __future__ import annotations

import fractions
import threading
import time
from typing import Any, Protocol

import av
from av.audio.stream import AudioStream
from av.container.output import OutputContainer

from app.egress.encode import AUDIO_RATE, MICROSECONDS, configure_audio
from app.egress.push_destination import Destination
from app.media.padded_packets import padded_packet
from app.media.whip_certificate import whip_certificate_options

OPEN_TIMEOUT_S = 10.0
IO_TIMEOUT_S = 10.0
# A caller that has not reached its listener in this long fails (srtsink would go on trying silently).
SRT_CONNECT_TIMEOUT_S = 5.0
# MPEG-TS is handed to srtsink in chunks of 7 TS packets, one SRT payload (the usual live setting).
TS_CHUNK = 188 * 7
AUDIO_CODECS = {"rtmp": "aac", "srt": "aac", "whip": "libopus"}  # what each kind of destination takes
MICROSECOND = fractions.Fraction(1, MICROSECONDS)


class PushSinkError(Exception):
    """The destination refused or dropped the push; the message is safe to show (no secrets)."""


class Sink(Protocol):
    def connected(self) -> bool: ...

    def send(self, video: bool, data: bytes, pts_us: int, keyframe: bool) -> int: ...

    def close(self) -> None: ...


class MuxSink:
    """One PyAV output container with an H.264 and an audio stream; `send` returns the bytes muxed."""

    def __init__(
        self,
        target: Any,
        fmt: str,
        width: int,
        height: int,
        fps: int,
        audio_codec: str,
        options: dict[str, str] | None = None,
        buffer_size: int = 32768,
    ) -> None:
        self.container: OutputContainer = av.open(
            target,
            "w",
            format=fmt,
            options=options or {},
            timeout=(OPEN_TIMEOUT_S, IO_TIMEOUT_S),
            buffer_size=buffer_size,
        )
        try:
            self.video = self.container.add_mux_stream("h264", rate=fps, width=width, height=height)
            audio = self.container.add_stream(audio_codec, rate=AUDIO_RATE)
            assert isinstance(audio, AudioStream)
            configure_audio(audio.codec_context)
            self.audio = audio
        except Exception:
            self.container.close()
            raise

    def connected(self) -> bool:
        return True  # FFmpeg's protocols are connected once the header is written (on the first packet)

    def send(self, video: bool, data: bytes, pts_us: int, keyframe: bool) -> int:
        packet = padded_packet(data)  # muxers and bitstream filters read past the data, as decoders do
        packet.stream = self.video if video else self.audio
        packet.time_base = MICROSECOND
        packet.pts = packet.dts = pts_us
        packet.is_keyframe = keyframe
        self.container.mux(packet)
        return len(data)

    def close(self) -> None:
        self.container.close()


def open_sink(destination: Destination, width: int, height: int, fps: int) -> Sink:
    """A sink for `destination`, connected on its first packet (SRT: a caller connects now)."""
    audio = AUDIO_CODECS[destination.kind]
    if destination.kind == "rtmp":
        return MuxSink(destination.target, "flv", width, height, fps, audio)
    if destination.kind == "whip":
        # A P-256 certificate for its DTLS: FFmpeg's own is P-224, which OpenSSL 4 receivers refuse.
        options = {**whip_certificate_options(), **({"authorization": destination.key} if destination.key else {})}
        return MuxSink(destination.target, "whip", width, height, fps, audio, options)
    return SrtSink(destination, width, height, fps)


class _Gst:
    """GStreamer through PyGObject, loaded on first use."""

    _lock = threading.Lock()
    _module: Any = None

    @classmethod
    def get(cls) -> Any:
        with cls._lock:
            if cls._module is None:
                try:
                    import gi

                    gi.require_version("Gst", "1.0")
                    from gi.repository import Gst
                except (ImportError, ValueError) as exc:
                    raise PushSinkError(f"SRT pushes need GStreamer through PyGObject: {exc}") from None
                Gst.init(None)
                if Gst.ElementFactory.find("srtsink") is None:
                    raise PushSinkError("SRT pushes need GStreamer's srtsink: apt-get install gstreamer1.0-plugins-bad")
                cls._module = Gst
            return cls._module


def srt_unavailable_reason() -> str | None:
    """Why SRT pushes cannot run here (None when they can)."""
    try:
        _Gst.get()
    except PushSinkError as exc:
        return str(exc)
    return None


class _SrtWriter:
    """The file PyAV's MPEG-TS muxer writes to: each chunk goes into the pipeline's appsrc."""

    def __init__(self, gst: Any, pipeline: Any, appsrc: Any, destination: Destination) -> None:
        self._gst, self._pipeline, self._appsrc = gst, pipeline, appsrc
        self._destination = destination
        self._bus = pipeline.get_bus()
        self.written = 0

    def write(self, data: bytes) -> int:
        self.check()
        result = self._appsrc.emit("push-buffer", self._gst.Buffer.new_wrapped(bytes(data)))
        if result != self._gst.FlowReturn.OK:
            self.check()
            raise PushSinkError(f"the SRT sink stopped taking data ({result.value_nick})")
        self.written += len(data)
        return len(data)

    def check(self) -> None:
        """Raises the pipeline's error, if it posted one."""
        message = self._bus.pop_filtered(self._gst.MessageType.ERROR)
        if message is not None:
            error, detail = message.parse_error()
            text = self._destination.redact(f"{error.message} ({detail or 'no detail'})")
            raise PushSinkError(f"SRT: {text}")


class SrtSink:
    """MPEG-TS (H.264 + AAC) into `appsrc ! srtsink`. In caller mode the connection is made when the pipeline
    starts (a destination that does not answer fails it); in listener mode it waits for a caller and drops what
    is sent meanwhile."""

    def __init__(self, destination: Destination, width: int, height: int, fps: int) -> None:
        gst = _Gst.get()
        self._gst = gst
        self._destination = destination
        self._started = time.monotonic()
        self._pipeline = gst.Pipeline.new("push-srt")
        appsrc = gst.ElementFactory.make("appsrc", "src")
        sink = gst.ElementFactory.make("srtsink", "sink")
        caps = gst.Caps.from_string("video/mpegts,systemstream=(boolean)true,packetsize=(int)188")
        appsrc.set_property("caps", caps)
        appsrc.set_property("is-live", True)
        appsrc.set_property("format", gst.Format.BYTES)
        appsrc.set_property("max-bytes", 4 * 1024 * 1024)
        sink.set_property("uri", destination.target)
        sink.set_property("wait-for-connection", False)
        sink.set_property("auto-reconnect", False)  # the push reconnects, with its own pause and count
        sink.set_property("sync", False)
        sink.set_property("async", False)
        self._sink = sink
        self._pipeline.add(appsrc)
        self._pipeline.add(sink)
        appsrc.link(sink)
        self._writer = _SrtWriter(gst, self._pipeline, appsrc, destination)
        try:
            if self._pipeline.set_state(gst.State.PLAYING) == gst.StateChangeReturn.FAILURE:
                self._writer.check()
                raise PushSinkError("SRT: the destination cannot be opened")
            self._writer.check()
            self._mux = MuxSink(self._writer, "mpegts", width, height, fps, "aac", buffer_size=TS_CHUNK)
        except Exception:
            self._pipeline.set_state(gst.State.NULL)
            raise

    def connected(self) -> bool:
        """Whether a peer takes the stream (srtsink's statistics have more than the byte count once one does);
        raises in caller mode when none answered within `SRT_CONNECT_TIMEOUT_S`."""
        self._writer.check()
        stats = self._sink.get_property("stats")
        if stats is not None and stats.n_fields() > 1:
            return True
        if self._destination.mode == "caller" and time.monotonic() - self._started > SRT_CONNECT_TIMEOUT_S:
            raise PushSinkError(f"SRT: no listener answered at {self._destination.shown}")
        return False

    def send(self, video: bool, data: bytes, pts_us: int, keyframe: bool) -> int:
        return self._mux.send(video, data, pts_us, keyframe)

    def close(self) -> None:
        try:
            self._mux.close()
        finally:
            self._pipeline.set_state(self._gst.State.NULL)
