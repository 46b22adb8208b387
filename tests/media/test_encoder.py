"""The live H.264 encoder: its settings reach libx264 (read back from the stream), the keyframe interval and
the bitrate band hold in what it sends, and NVENC falls back to libx264 where it cannot be opened."""

import logging
import re
import time
from fractions import Fraction

import av
import numpy as np
import pytest
from aiortc.codecs.h264 import h264_depayload
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from app.media import encoder as encoder_module
from app.media.clips import load_sample, make_motion_clip
from app.media.encoder import (
    NVENC,
    X264,
    LiveH264Encoder,
    bitrate_band,
    create_encoder,
    install_timed_encoders,
    open_codec,
)
from app.media.hops import TimedEncoder
from app.pipeline.types import Image
from app.settings import EncoderSettings

H264 = RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000, payloadType=102)


@pytest.fixture(scope="module")
def clip() -> list[Image]:
    still = load_sample("astronaut")
    return make_motion_clip(still, size=(640, 480), frames=30, focus=(225.0, 118.0), noise_sigma=3.0, seed=1).frames


def encode(encoder: LiveH264Encoder, images: list[Image], start: int = 0) -> list[bytes]:
    """Each frame's H.264 (Annex B), put back together from the RTP payloads aiortc would send."""
    out = []
    for index, image in enumerate(images, start):
        frame = av.VideoFrame.from_ndarray(image, format="bgr24")
        frame.pts = index * 3000
        frame.time_base = Fraction(1, 90000)
        payloads, _ = encoder.encode(frame)
        out.append(b"".join(h264_depayload(p) for p in payloads))
    return out


def nal_types(data: bytes) -> set[int]:
    return {data[m.end()] & 0x1F for m in re.finditer(b"\x00\x00\x01", data) if m.end() < len(data)}


def x264_options(data: bytes) -> dict[str, str]:
    """The settings libx264 writes into its SEI message, as name -> value."""
    match = re.search(rb"x264 - core .*? options: ([^\x00\x80]*)", data)
    assert match is not None, "no x264 settings in the stream"
    return dict(item.split("=", 1) for item in match.group(1).decode().split() if "=" in item)


def test_settings_reach_libx264(clip: list[Image]) -> None:
    settings = EncoderSettings(backend="x264", x264_preset="ultrafast", keyframe_interval_s=1.5, threads=1)
    first = encode(LiveH264Encoder(settings), clip[:1])[0]
    options = x264_options(first)
    assert options["keyint"] == "45"
    assert options["bframes"] == "0" and options["rc_lookahead"] == "0"  # tune zerolatency
    assert options["rc"] == "abr" and options["bitrate"] == "800"  # the 480p band's minimum before any REMB
    assert options["vbv_maxrate"] == "3000"  # the band's maximum caps the peaks
    assert options["vbv_bufsize"] == "160"  # 0.2 s of the rate: no frame, a keyframe included, much larger
    assert options["threads"] == "1"
    assert options["subme"] == "0" and options["me"] == "dia"  # ultrafast
    faster = LiveH264Encoder(settings.model_copy(update={"x264_preset": "veryfast"}))
    veryfast = x264_options(encode(faster, clip[:1])[0])
    assert veryfast["subme"] == "2" and veryfast["me"] == "hex"


def test_keyframe_interval(clip: list[Image]) -> None:
    settings = EncoderSettings(backend="x264", x264_preset="ultrafast", keyframe_interval_s=0.5)
    frames = encode(LiveH264Encoder(settings), clip + clip)
    idr = [i for i, data in enumerate(frames) if 5 in nal_types(data)]
    assert idr[:4] == [0, 15, 30, 45]
    assert all(b - a <= 15 for a, b in zip(idr, idr[1:], strict=False))


def test_bitrate_stays_in_the_resolutions_band(clip: list[Image]) -> None:
    """A receiver's estimate outside the band is clamped: 10 Mbit/s asked gives at most the 480p maximum,
    100 kbit/s asked gives the floor (half the minimum by default; the minimum itself with estimate_floor=1);
    and what is sent follows."""
    settings = EncoderSettings(backend="x264", x264_preset="ultrafast", bitrate_kbps={480: (1000, 2000)})
    sent = {}
    for asked, floor, expected in (
        (10_000_000, 0.5, 2_000_000),
        (100_000, 0.5, 500_000),
        (100_000, 1.0, 1_000_000),
    ):
        encoder = LiveH264Encoder(settings.model_copy(update={"estimate_floor": floor}))
        encoder.target_bitrate = asked
        frames = encode(encoder, clip + clip)
        assert encoder.codec is not None
        sent[expected] = sum(len(f) for f in frames[15:]) * 8 / (45 / 30)
        assert encoder.codec.bit_rate == expected
    assert 1_500_000 < sent[2_000_000] < 2_400_000
    assert 700_000 < sent[1_000_000] < 1_300_000
    assert 300_000 < sent[500_000] < 700_000


def test_requested_keyframes_leave_at_most_once_per_interval(clip: list[Image]) -> None:
    """Keyframe requests (PLI/FIR) within keyframe_min_interval_s of the last answered one are answered when it
    ends, once; the first is answered at once."""
    settings = EncoderSettings(backend="x264", x264_preset="ultrafast", keyframe_min_interval_s=0.5)
    encoder = LiveH264Encoder(settings)
    encode(encoder, clip[:2])

    def requested(index: int) -> bool:
        frame = av.VideoFrame.from_ndarray(clip[index % len(clip)], format="bgr24")
        frame.pts, frame.time_base = index * 3000, Fraction(1, 90000)
        payloads, _ = encoder.encode(frame, force_keyframe=True)
        return 5 in nal_types(b"".join(h264_depayload(p) for p in payloads))

    assert requested(2), "the first request is answered at once"
    assert not any(requested(i) for i in range(3, 8)), "the storm that follows is not"
    assert encoder.keyframes_deferred == 5
    time.sleep(0.55)
    frames = encode(encoder, clip[8:10], 8)
    assert 5 in nal_types(frames[0]) and 5 not in nal_types(frames[1]), "one owed keyframe when the interval ends"


def test_a_requested_keyframe_fits_a_fifth_of_a_second_of_the_rate() -> None:
    """At 720p and 1.2 Mbit/s (a stream settled under a 1.5 Mbit/s cap) a keyframe asked for mid-stream is
    about 0.2 s of the rate, so it fits a 150 ms queue at the cap (with half a second of the band's maximum
    as buffer it was 69 KB, 3 times that queue)."""
    still = load_sample("astronaut")
    clip = make_motion_clip(still, size=(1280, 720), frames=50, focus=(450.0, 236.0), noise_sigma=3.0, seed=1)
    encoder = LiveH264Encoder(EncoderSettings(backend="x264", x264_preset="superfast", threads=1))
    encoder.target_bitrate = 1_200_000
    frames = encode(encoder, clip.frames[:45])
    frame = av.VideoFrame.from_ndarray(clip.frames[45], format="bgr24")
    frame.pts, frame.time_base = 45 * 3000, Fraction(1, 90000)
    payloads, _ = encoder.encode(frame, force_keyframe=True)
    keyframe = b"".join(h264_depayload(p) for p in payloads)
    assert 5 in nal_types(keyframe)
    assert len(keyframe) * 8 <= 1.5 * 0.2 * 1_200_000, (len(keyframe), [len(f) for f in frames[-5:]])


def test_bitrate_band_choice() -> None:
    settings = EncoderSettings(bitrate_kbps={480: (800, 3000), 720: (1500, 6000)})
    assert bitrate_band(640, 480, settings).max_bps == 3_000_000
    assert bitrate_band(1280, 720, settings).max_bps == 6_000_000
    assert bitrate_band(720, 1280, settings).max_bps == 6_000_000  # portrait: the short side counts
    assert bitrate_band(1920, 1080, settings).max_bps == 6_000_000  # taller than every band: the largest
    assert bitrate_band(1920, 1080, settings).clamp(100) == 1_500_000


def test_a_big_change_of_the_estimate_reopens_the_codec(clip: list[Image]) -> None:
    encoder = LiveH264Encoder(EncoderSettings(backend="x264", x264_preset="ultrafast"))
    encode(encoder, clip[:5])
    codec = encoder.codec
    encoder.target_bitrate = 850_000  # within 25% of 800 kbit/s: kept
    encode(encoder, clip[5:10], 5)
    assert encoder.codec is codec
    encoder.target_bitrate = 2_500_000
    frames = encode(encoder, clip[10:12], 10)
    assert encoder.codec is not codec and encoder.codec is not None and encoder.codec.bit_rate == 2_500_000
    assert 5 in nal_types(frames[0])


def test_heavy_loss_in_the_receivers_reports_lowers_the_rate_at_once(clip: list[Image]) -> None:
    encoder = LiveH264Encoder(EncoderSettings(backend="x264", x264_preset="ultrafast"))
    encode(encoder, clip[:5])
    codec = encoder.codec
    assert codec is not None and codec.bit_rate == 800_000
    assert encoder.loss_control is None, "no report yet: the estimate alone"
    encoder.report_loss(0.3, now=time.monotonic())
    encoder.target_bitrate = 2_500_000  # the estimate is now a ceiling: the rate rises on clean reports only
    frames = encode(encoder, clip[5:7], 5)
    assert encoder.codec is not codec and encoder.codec is not None
    assert encoder.codec.bit_rate == 680_000, "a cut of 15% (half the 30% lost) reopens the codec"
    assert 5 in nal_types(frames[0])
    stats = encoder.rate_stats()
    assert stats["target_bps"] == 680_000 and stats["reason"] == "decrease" and stats["fraction_lost"] == 0.3
    assert stats["estimate_bps"] == 2_500_000 and stats["loss_control"] is True


def test_with_loss_control_off_the_reports_change_nothing(clip: list[Image]) -> None:
    encoder = LiveH264Encoder(EncoderSettings(backend="x264", x264_preset="ultrafast", loss_control=False))
    encode(encoder, clip[:3])
    encoder.report_loss(0.5, now=time.monotonic())
    encoder.report_retransmitted(100_000, now=time.monotonic())
    assert encoder.loss_control is None and encoder.target_bitrate == 800_000
    assert encoder.rate_stats() == {"target_bps": 800_000, "loss_control": False}


def test_loss_control_is_on_by_default_and_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert EncoderSettings().loss_control is True
    monkeypatch.setenv("SWAPCAST_ENCODER_LOSS_CONTROL", "false")
    assert EncoderSettings().loss_control is False


def _nvenc_opens() -> bool:
    settings = EncoderSettings()
    try:
        open_codec(NVENC, 640, 480, 1_000_000, bitrate_band(640, 480, settings), settings)
    except Exception:
        return False
    return True


@pytest.mark.parametrize("backend", ["auto", "nvenc"])
def test_nvenc_where_it_opens_else_libx264(
    clip: list[Image], backend: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(encoder_module, "_nvenc_failed", None)
    caplog.set_level(logging.INFO, logger="app.media.encoder")
    expected = NVENC if _nvenc_opens() else X264
    encoder = LiveH264Encoder(EncoderSettings(backend=backend))
    frames = encode(encoder, clip[:3])
    assert encoder.backend == expected
    assert len(frames) == 3 and all(frames)
    decoder = av.CodecContext.create("h264", "r")
    decoded = [f for data in frames for f in decoder.decode(av.Packet(data))]
    assert len(decoded) == 3 and decoded[0].width == 640
    if expected == X264:
        assert encoder_module.nvenc_failure() is not None
        assert "NVENC is not available" in caplog.text


def test_x264_backend_never_tries_nvenc(clip: list[Image], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(encoder_module, "_nvenc_failed", None)
    encoder = LiveH264Encoder(EncoderSettings(backend="x264"))
    encode(encoder, clip[:1])
    assert encoder.backend == X264 and encoder_module.nvenc_failure() is None


def test_sessions_get_the_live_encoder() -> None:
    from aiortc import rtcrtpsender

    install_timed_encoders()
    encoder = rtcrtpsender.get_encoder(H264)
    assert isinstance(encoder, TimedEncoder)
    assert isinstance(create_encoder(H264), LiveH264Encoder)
    assert isinstance(encoder._inner, LiveH264Encoder)


def test_bad_bands_are_refused() -> None:
    with pytest.raises(ValueError, match="min <= max"):
        EncoderSettings(bitrate_kbps={480: (3000, 800)})
    assert np.isfinite(EncoderSettings().keyframe_interval_s)


def test_a_receiver_that_cannot_ask_for_packets_gets_a_keyframe_every_half_second_while_it_reports_loss(
    clip: list[Image],
) -> None:
    """With `keyframes_under_loss(0.5)` (no NACK negotiated) a reported loss brings keyframes every 0.5 s of
    frames, past the 2 s schedule and without a request; a clean report leaves the schedule alone."""
    now = [0.0]
    settings = EncoderSettings(backend="x264", x264_preset="ultrafast", keyframe_interval_s=2.0)
    encoder = LiveH264Encoder(settings, clock=lambda: now[0])
    encoder.keyframes_under_loss(0.5)

    def keyframes(first: int, count: int) -> int:
        found = 0
        for index in range(first, first + count):
            frame = av.VideoFrame.from_ndarray(clip[index % len(clip)], format="bgr24")
            frame.pts, frame.time_base = index * 3000, Fraction(1, 90000)
            payloads, _ = encoder.encode(frame)
            found += 5 in nal_types(b"".join(h264_depayload(p) for p in payloads))
            now[0] += 1 / 30
        return found

    assert keyframes(0, 45) == 1, "no loss reported: the first keyframe only, within 1.5 s"
    encoder.report_loss(0.01, now[0])
    assert keyframes(45, 30) == 2, "a second of loss: a keyframe every half second"
    assert encoder.keyframes_for_loss == 2 and encoder.keyframes_forced == 0
    encoder.keyframes_under_loss(None)  # a receiver that asks for packets: the schedule alone
    encoder.report_loss(0.01, now[0])
    assert keyframes(75, 15) == 0
