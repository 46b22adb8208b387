"""Packets that own their bytes followed by the zeroed padding FFmpeg reads past the end, and aiortc's receivers
decoding from them.

libavcodec requires every packet's data to be followed by AV_INPUT_BUFFER_PADDING_SIZE (64) readable bytes: its
bitstream readers and H.264's NAL unescaping read up to 8 bytes beyond the data. PyAV 18 builds `av.Packet(bytes)`
on the caller's memory (zero-copy, no padding), and aiortc 1.16's decoders do that with every received frame, so a
frame whose bytes ended a few bytes before an unmapped page killed the whole server with SIGSEGV.

`padded_packet` copies the bytes into a packet libavcodec allocated itself (`av_new_packet`: the size plus the
padding, zeroed); `padded_decoder` is aiortc's decoder for a codec (its codec context and settings) fed only such
packets, and `use_padded_decoders` makes it the one aiortc's receivers get. Neither depends on how aiortc or PyAV
build packets from bytes: tests/media/test_padded_packets.py decodes frames that end at an unmapped page through
the decoder a receiver gets.
"""

from __future__ import annotations

import fractions
import logging

import av
from aiortc.codecs import get_decoder as aiortc_decoder
from aiortc.codecs.base import Decoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters
from av.audio.codeccontext import AudioCodecContext
from av.frame import Frame
from av.video.codeccontext import VideoCodecContext

log = logging.getLogger(__name__)

# aiortc stamps its frames in these units: the RTP clock, except G.722's, whose RTP clock (8000, RFC 3551) is half
# its sample rate.
TIME_BASES = {"audio/g722": fractions.Fraction(1, 16000)}


def padded_packet(data: bytes | bytearray | memoryview) -> av.Packet:
    """A packet holding a copy of `data`, padded as libavcodec requires (safe to decode and to mux)."""
    view = memoryview(data).cast("B")
    packet = av.Packet(view.nbytes)  # av_new_packet: its own buffer, with the zeroed padding
    if view.nbytes:
        memoryview(packet)[:] = view
    return packet


class PaddedDecoder(Decoder):
    """An aiortc decoder (the frames, their time stamps and errors aiortc's would give) that decodes copies of
    the received frames in padded packets."""

    def __init__(self, context: VideoCodecContext | AudioCodecContext, time_base: fractions.Fraction) -> None:
        self.codec = context
        self.time_base = time_base

    def decode(self, encoded_frame: JitterFrame) -> list[Frame]:
        if not encoded_frame.data:
            return []  # an empty packet would drain the decoder: aiortc's decodes nothing after one (EOFError)
        packet = padded_packet(encoded_frame.data)
        packet.pts = encoded_frame.timestamp
        packet.time_base = self.time_base
        return list(self.codec.decode(packet))


def padded_decoder(codec: RTCRtpCodecParameters) -> Decoder:
    """aiortc's decoder for `codec` (its codec context and settings), decoding from padded packets; aiortc's own,
    unchanged, where it keeps no PyAV codec context to take over."""
    decoder = aiortc_decoder(codec)
    context = getattr(decoder, "codec", None)
    if not isinstance(context, VideoCodecContext | AudioCodecContext):
        log.warning("aiortc's %s decoder has no codec context: it decodes as aiortc does", codec.mimeType)
        return decoder
    mime = codec.mimeType.lower()
    return PaddedDecoder(context, TIME_BASES.get(mime, fractions.Fraction(1, codec.clockRate)))


def use_padded_decoders() -> None:
    """Make every aiortc receiver of this process decode with `padded_decoder` (idempotent). A receiver's decoder
    thread calls the `get_decoder` that aiortc's rtcrtpreceiver module imported: that name is replaced."""
    from aiortc import rtcrtpreceiver

    current = getattr(rtcrtpreceiver, "get_decoder", None)
    if current is padded_decoder:
        return
    if current is not aiortc_decoder:
        log.warning("this aiortc's receivers do not get decoders from aiortc.codecs.get_decoder; not replaced")
        return
    rtcrtpreceiver.get_decoder = padded_decoder
