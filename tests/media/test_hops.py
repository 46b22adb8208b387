"""Hop timing: the encoder wrapper times a real aiortc H.264 encode and leaves other frames alone."""

import fractions

import av
import numpy as np
from aiortc import RTCRtpCodecParameters
from aiortc.codecs import get_encoder
from prometheus_client import CollectorRegistry

from app.live.hops import HopRecorder
from app.media.hops import TimedEncoder
from app.observability import Metrics
from app.pipeline.timing import StageTimer


def frame(index: int) -> av.VideoFrame:
    image = np.random.default_rng(index).integers(0, 255, (240, 320, 3), dtype=np.uint8)
    out = av.VideoFrame.from_ndarray(image, format="bgr24")
    out.pts, out.time_base = index * 3000, fractions.Fraction(1, 90000)
    return out


def test_a_real_encode_is_timed_and_reported_to_the_frame() -> None:
    codec = RTCRtpCodecParameters(mimeType="video/H264", clockRate=90000, payloadType=102)
    encoder = TimedEncoder(get_encoder(codec))
    encoder.target_bitrate = 2_000_000
    assert encoder.target_bitrate == 2_000_000
    reports: list[tuple[float, float]] = []
    timed = frame(0)
    timed.opaque = lambda started, ended: reports.append((started, ended))
    payloads, _ = encoder.encode(timed, False)
    assert payloads and len(reports) == 1 and reports[0][1] > reports[0][0]
    payloads, _ = encoder.encode(frame(1), False)  # no callback: encoded as before, nothing reported
    assert payloads and len(reports) == 1


def test_recorder_summarises_hops_and_feeds_prometheus() -> None:
    metrics = Metrics(CollectorRegistry())
    hops = HopRecorder(metrics.hop_seconds)
    timer = StageTimer()
    for i in range(20):
        hops.observe("queue", 0.001 * (i + 1))
        timer.add("detect", 0.010)
    hops.observe_stages(timer)
    summary = hops.summary()
    assert list(summary) == ["queue", "detect"]
    assert summary["queue"]["p50"] == 10.5 and summary["detect"]["p95"] == 10.0
    assert 'swapcast_hop_seconds_count{hop="detect",kind="session"} 20.0' in metrics.render()[0].decode()
