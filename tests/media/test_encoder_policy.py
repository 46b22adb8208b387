"""The one encoder policy: the same settings reach the shared encodes' and the WHEP hub's PyAV codecs and aiortc's
senders."""

from fractions import Fraction
from typing import Any

import pytest
from aiortc import rtcrtpsender
from aiortc.rtcrtpparameters import RTCRtpCodecParameters

from app.media import encoder as encoder_module
from app.media.encoder import X264, EncoderPolicy, LiveH264Encoder
from app.media.hops import TimedEncoder
from app.settings import EncoderSettings

RTP_CLOCK = Fraction(1, 90000)


def test_shared_rate_is_a_tenth_of_a_bit_per_pixel_inside_the_band() -> None:
    policy = EncoderPolicy(EncoderSettings())
    assert policy.shared_bitrate_kbps(640, 480, 30) == 922
    assert policy.shared_bitrate_kbps(1280, 720, 30) == 2765
    assert policy.shared_bitrate_kbps(320, 240, 30) == 800  # below the 480 band: its minimum
    assert policy.shared_bitrate_kbps(3840, 2160, 60) == 10000  # above the largest band: its maximum


def test_the_shared_pyav_codec_uses_the_shared_preset_rate_and_keyframe_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    presets: list[str] = []
    real_open = encoder_module.open_codec

    def spy(name: str, *args: Any) -> Any:
        presets.append(args[4].x264_preset)
        return real_open(name, *args)

    monkeypatch.setattr(encoder_module, "open_codec", spy)
    policy = EncoderPolicy(EncoderSettings(backend="x264", keyframe_interval_s=3.0))
    codec = policy.open_shared(640, 480, RTP_CLOCK)
    assert presets == ["ultrafast"]  # the session's own stays superfast
    assert codec.name == X264
    assert codec.gop_size == 90
    assert abs(codec.bit_rate - 921_600) < 1000  # x264 keeps whole kbit/s
    assert codec.time_base == RTP_CLOCK


def test_install_gives_aiortc_the_policy_encoder() -> None:
    settings = EncoderSettings(x264_preset="veryfast")
    EncoderPolicy(settings).install()
    encoder = rtcrtpsender.get_encoder(RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000))
    assert isinstance(encoder, TimedEncoder)
    inner = encoder._inner
    assert isinstance(inner, LiveH264Encoder) and inner.settings == settings
    EncoderPolicy(EncoderSettings()).install()
