"""Every packet the server decodes or muxes owns its bytes and FFmpeg's zeroed padding: a received frame that ends
just before an unmapped page is decoded without a fault (it killed the server with SIGSEGV), the decoders aiortc's
receivers get decode what aiortc's own would, and a push's muxer is handed padded copies."""

import ctypes
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path
from typing import Any

import av
import numpy as np
from aiortc import RTCRtpReceiver, rtcrtpreceiver
from aiortc.codecs import get_decoder as aiortc_decoder
from aiortc.jitterbuffer import JitterFrame
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

import app.media.peer  # noqa: F401  (the server's peer side: it sets up the receivers' decoders)
from app.egress.push_sinks import MuxSink
from app.media.padded_packets import PaddedDecoder, padded_packet
from tests.media.guard_page_decode import ACCESS_UNITS, GAPS, HEADER, access_units

REPO = Path(__file__).resolve().parents[2]
PADDING = 64  # AV_INPUT_BUFFER_PADDING_SIZE


def test_a_received_frame_ending_at_an_unmapped_page_is_decoded_without_a_fault() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.media.guard_page_decode"], cwd=REPO, capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["probe_signal"] == "SIGSEGV"  # the guard page is where the placements put it
    assert result["placements"] == ACCESS_UNITS * len(GAPS)
    assert result["faults"] == [], f"decoding faulted in {len(result['faults'])} of {result['placements']} placements"


def _codec(capability: Any, payload_type: int) -> RTCRtpCodecParameters:
    return RTCRtpCodecParameters(
        mimeType=capability.mimeType,
        clockRate=capability.clockRate,
        channels=capability.channels,
        payloadType=payload_type,
        parameters=capability.parameters,
    )


def _capabilities(kind: str) -> list[Any]:
    capabilities = RTCRtpReceiver.getCapabilities(kind)
    assert capabilities is not None
    return capabilities.codecs


def test_every_codec_a_receiver_can_get_is_decoded_from_padded_packets() -> None:
    codecs = [c for kind in ("audio", "video") for c in _capabilities(kind) if c.name != "rtx"]
    assert {c.mimeType.lower() for c in codecs} >= {"video/h264", "video/vp8", "audio/opus"}
    for number, capability in enumerate(codecs):
        assert isinstance(rtcrtpreceiver.get_decoder(_codec(capability, 96 + number)), PaddedDecoder), capability


def _frames(decoder: Any, units: list[bytes], step: int) -> list[Any]:
    return [f for n, u in enumerate(units) for f in decoder.decode(JitterFrame(data=u, timestamp=n * step))]


def test_the_receivers_h264_decoder_gives_the_frames_aiortcs_own_gives() -> None:
    units = access_units(count=6)
    h264 = RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000, payloadType=102)
    ours, theirs = _frames(rtcrtpreceiver.get_decoder(h264), units, 3000), _frames(aiortc_decoder(h264), units, 3000)
    assert len(ours) == len(theirs) >= 1
    for mine, other in zip(ours, theirs, strict=True):
        assert (mine.width, mine.height, mine.pts, mine.time_base) == (320, 240, other.pts, Fraction(1, 90000))
        assert np.array_equal(mine.to_ndarray(), other.to_ndarray())


def test_an_empty_received_frame_does_not_stop_the_receivers_decoder() -> None:
    # An RTP packet may carry no media (a VP8 descriptor alone, an empty FU-A fragment): aiortc's own decoder
    # takes the empty frame for the end of the stream and decodes nothing after it.
    units = access_units(count=4)
    h264 = RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000, payloadType=102)
    frames = _frames(rtcrtpreceiver.get_decoder(h264), [units[0], b"", *units[1:]], 3000)
    assert len(frames) == len(_frames(aiortc_decoder(h264), units, 3000)) >= 2


def test_the_receivers_opus_decoder_gives_the_sound_aiortcs_own_gives() -> None:
    encoder = av.CodecContext.create("libopus", "w")
    encoder.sample_rate, encoder.layout, encoder.format = 48000, "stereo", "s16"
    encoder.time_base = Fraction(1, 48000)
    tone = (np.sin(np.arange(960 * 10) * 440 * 2 * np.pi / 48000) * 8000).astype(np.int16)
    units: list[bytes] = []
    for n in range(10):
        frame = av.AudioFrame.from_ndarray(np.repeat(tone[None, n * 960 : (n + 1) * 960], 2, 1), "s16", "stereo")
        frame.sample_rate, frame.pts = 48000, n * 960
        units.extend(bytes(p) for p in encoder.encode(frame))
    opus = RTCRtpCodecParameters(mimeType="audio/opus", clockRate=48000, channels=2, payloadType=111)
    ours, theirs = _frames(rtcrtpreceiver.get_decoder(opus), units, 960), _frames(aiortc_decoder(opus), units, 960)
    assert len(ours) == len(theirs) >= 5
    for mine, other in zip(ours, theirs, strict=True):
        assert (mine.pts, mine.time_base, mine.samples) == (other.pts, Fraction(1, 48000), other.samples)
        assert np.array_equal(mine.to_ndarray(), other.to_ndarray())


def _owns_padded_copy(packet: av.Packet, data: bytes) -> bool:
    """The packet holds `data` in memory of its own, followed by the zeroed padding."""
    own = packet.buffer_ptr != id(data) + HEADER
    padding = ctypes.string_at(packet.buffer_ptr + packet.size, PADDING) if own else b""
    return own and bytes(packet) == data and padding == bytes(PADDING)


def test_a_padded_packet_owns_a_copy_followed_by_zeroed_padding() -> None:
    data = bytes(range(256)) * 5
    assert _owns_padded_copy(padded_packet(data), data)
    assert _owns_padded_copy(padded_packet(memoryview(data)[5:300]), data[5:300])
    assert padded_packet(b"").size == 0


class _RecordingContainer:
    """A push's output container that records whether each packet it is handed is a padded copy."""

    def __init__(self, container: Any, sent: list[bytes]) -> None:
        self._container = container
        self._sent = sent
        self.checked: list[bool] = []

    def mux(self, packet: av.Packet) -> None:
        self.checked.append(_owns_padded_copy(packet, self._sent[len(self.checked)]))
        self._container.mux(packet)

    def close(self) -> None:
        self._container.close()


def test_a_push_muxes_padded_copies_of_its_packets(tmp_path: Path) -> None:
    units = access_units(count=3)
    sink = MuxSink(str(tmp_path / "push.flv"), "flv", 320, 240, 30, "aac")
    recorder = _RecordingContainer(sink.container, units)
    sink.container = recorder  # type: ignore[assignment]
    for n, unit in enumerate(units):
        sink.send(True, unit, n * 33_333, n == 0)
    sink.close()
    assert recorder.checked == [True] * len(units)
    with av.open(str(tmp_path / "push.flv")) as written:
        assert [bytes(p) for p in written.demux(video=0) if p.size] != []
