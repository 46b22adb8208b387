"""`swapcast bench-encoder`: the live H.264 encoder's speed against its quality, per x264 preset and thread count.

A clip made from a real face photo (moving camera, sensor-like noise) is encoded by `LiveH264Encoder` (the
encoder sessions use, through aiortc's packetiser) at one fixed bitrate per resolution, decoded again, and
compared with what was sent: PSNR over the BGR frames and SSIM over their luma, next to the encode time per
frame (p50/p99) and the bitrate that came out. Same bitrate for every preset, so the quality differences are
what the preset's extra time buys.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import av
import cv2
import numpy as np
from aiortc.codecs.h264 import h264_depayload
from skimage.metrics import structural_similarity

from app.media.encoder import FRAME_RATE, LiveH264Encoder
from app.pipeline.types import Image
from app.settings import EncoderSettings, X264Preset

RESOLUTIONS = {"480p": (640, 480), "720p": (1280, 720)}
# The same rate for every preset: inside each resolution's default band, where presets differ most.
BITRATES_KBPS = {"480p": 1500, "720p": 3000}
PRESETS: tuple[X264Preset, ...] = ("ultrafast", "superfast", "veryfast", "faster", "medium")


@dataclass(frozen=True)
class EncoderBenchConfig:
    resolutions: tuple[str, ...] = ("480p", "720p")
    presets: tuple[X264Preset, ...] = PRESETS
    threads: tuple[int, ...] = (1, 0)
    frames: int = 90
    skip: int = 15  # the first frames are left out of the quality figures: the rate control settles


def encode_decode(frames: list[Image], settings: EncoderSettings, bitrate: int) -> tuple[list[Image], list[float], int]:
    """Encode `frames` as a session would, decode the RTP payloads back: (decoded BGR frames, encode seconds per
    frame, bytes sent)."""
    encoder = LiveH264Encoder(settings)
    encoder.target_bitrate = bitrate
    decoder = av.CodecContext.create("h264", "r")
    decoded: list[Image] = []
    seconds: list[float] = []
    sent = 0
    for index, image in enumerate(frames):
        frame = av.VideoFrame.from_ndarray(image, format="bgr24")
        frame.pts = index * (90000 // FRAME_RATE)
        frame.time_base = Fraction(1, 90000)
        started = time.perf_counter()
        payloads, _timestamp = encoder.encode(frame)
        seconds.append(time.perf_counter() - started)
        sent += sum(len(p) for p in payloads)
        stream = b"".join(h264_depayload(p) for p in payloads)
        for packet in decoder.parse(stream):
            decoded.extend(np.asarray(f.to_ndarray(format="bgr24")) for f in decoder.decode(packet))
    for packet in decoder.parse(b""):
        decoded.extend(np.asarray(f.to_ndarray(format="bgr24")) for f in decoder.decode(packet))
    decoded.extend(np.asarray(f.to_ndarray(format="bgr24")) for f in decoder.decode(None))
    return decoded, seconds, sent


def quality(sent: list[Image], received: list[Image]) -> tuple[float, float]:
    """Mean PSNR (dB, BGR) and mean SSIM (luma) of the frames received against those sent."""
    pairs = list(zip(sent, received, strict=True))
    psnr = [cv2.PSNR(a, b) for a, b in pairs]
    ssim = [float(structural_similarity(_luma(a), _luma(b), data_range=255)) for a, b in pairs]
    return float(np.mean(psnr)), float(np.mean(ssim))


def _luma(image: Image) -> Image:
    return np.asarray(cv2.cvtColor(image, cv2.COLOR_BGR2GRAY), np.uint8)


def _clip(resolution: str, count: int) -> list[Image]:
    from app.media.clips import load_sample, make_motion_clip

    return make_motion_clip(
        load_sample("astronaut"),
        size=RESOLUTIONS[resolution],
        frames=count,
        focus=(225.0, 118.0),
        noise_sigma=2.0,
        seed=5,
    ).frames


def colour_conversion(frames: list[Image], face_width: float, detect_size: int = 640) -> dict[str, Any]:
    """Per frame, side by side: the whole-frame round trip the live path makes today (yuv420p -> BGR for
    the pipeline, BGR -> yuv420p for the encoder) against the YUV way of app.media.yuv (a scaled BGR view
    for the detector, one face region to BGR and back into the planes). Milliseconds, p50 and p99."""
    from app.media.yuv import detector_input, read_bgr, region, write_bgr

    full: list[float] = []
    regions: list[float] = []
    height, width = frames[0].shape[:2]
    box = [
        width / 2 - face_width / 2,
        height / 2 - face_width * 0.6,
        width / 2 + face_width / 2,
        height / 2 + face_width * 0.6,
    ]
    area = region(box, width, height, margin=0.25)
    for image in frames:
        frame = av.VideoFrame.from_ndarray(image, format="bgr24").reformat(format="yuv420p")
        started = time.perf_counter()
        bgr = frame.to_ndarray(format="bgr24")
        av.VideoFrame.from_ndarray(bgr, format="bgr24").reformat(format="yuv420p")
        full.append(time.perf_counter() - started)
        started = time.perf_counter()
        detector_input(frame, detect_size)
        write_bgr(frame, area, read_bgr(frame, area))
        regions.append(time.perf_counter() - started)
    a, b = (np.asarray(v, np.float64) * 1000.0 for v in (full, regions))
    return {
        "face_region": [area.width, area.height],
        "whole_frame_ms": {"p50": round(float(np.percentile(a, 50)), 2), "p99": round(float(np.percentile(a, 99)), 2)},
        "yuv_regions_ms": {"p50": round(float(np.percentile(b, 50)), 2), "p99": round(float(np.percentile(b, 99)), 2)},
        "ratio_p50": round(float(np.percentile(b, 50) / np.percentile(a, 50)), 2),
    }


def run_encoder_bench(config: EncoderBenchConfig) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    conversions: dict[str, Any] = {}
    for resolution in config.resolutions:
        frames = _clip(resolution, config.frames)
        conversions[resolution] = colour_conversion(frames, face_width=RESOLUTIONS[resolution][1] * 0.3)
        bitrate = BITRATES_KBPS[resolution] * 1000
        for threads in config.threads:
            for preset in config.presets:
                settings = EncoderSettings(
                    backend="x264", x264_preset=preset, threads=threads, bitrate_kbps={10000: (100, 100000)}
                )
                decoded, seconds, sent = encode_decode(frames, settings, bitrate)
                if len(decoded) != len(frames):
                    raise RuntimeError(f"{len(frames)} frames encoded, {len(decoded)} decoded ({preset})")
                psnr, ssim = quality(frames[config.skip :], decoded[config.skip :])
                ms = np.asarray(seconds, np.float64) * 1000.0
                rows.append(
                    {
                        "resolution": resolution,
                        "preset": preset,
                        "threads": threads,
                        "target_kbps": bitrate // 1000,
                        "kbps": round(sent * 8 / (len(frames) / FRAME_RATE) / 1000),
                        "encode_ms": {
                            "p50": round(float(np.percentile(ms, 50)), 2),
                            "p99": round(float(np.percentile(ms, 99)), 2),
                        },
                        "psnr_db": round(psnr, 2),
                        "ssim": round(ssim, 4),
                    }
                )
    return {
        "config": {"frames": config.frames, "skipped_for_quality": config.skip, "fps": FRAME_RATE},
        "machine": {"cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
        "rows": rows,
        # The live path's colour conversions per frame: whole frame both ways vs face regions (app.media.yuv).
        "colour_conversion": conversions,
    }
