"""The invisible watermark on real photos: invisible by PSNR, read back after real H.264 (PyAV/libx264), a
halving of the size and a crop; never read from unmarked video or with another key."""

import io
from fractions import Fraction

import av
import cv2
import numpy as np
import pytest

from app.media.clips import load_sample, make_motion_clip
from app.pipeline.types import Image
from app.provenance.code import MarkCode
from app.provenance.detect import detect_windows
from app.provenance.embed import Watermarker
from app.provenance.payload import Payload

PAYLOAD = Payload(server_id=0x1234, mark_id=0xABCDEF, hour=42)
CODE = MarkCode("test-key")


@pytest.fixture(scope="module")
def frames() -> list[Image]:
    clip = make_motion_clip(load_sample("tom_hanks"), size=(1280, 720), frames=8, noise_sigma=1.0, seed=3)
    return clip.frames


@pytest.fixture(scope="module")
def marked(frames: list[Image]) -> list[Image]:
    marker = Watermarker(PAYLOAD, CODE)
    return [marker.embed(f) for f in frames]


def h264(frames: list[Image], *, crf: int, size: tuple[int, int] | None = None) -> list[Image]:
    h, w = frames[0].shape[:2]
    tw, th = size or (w // 2 * 2, h // 2 * 2)
    buf = io.BytesIO()
    with av.open(buf, mode="w", format="mp4") as out:
        stream = out.add_stream("libx264", rate=30, options={"crf": str(crf), "preset": "veryfast"})
        stream.width, stream.height, stream.pix_fmt = tw, th, "yuv420p"
        stream.codec_context.time_base = Fraction(1, 30)
        for i, frame in enumerate(frames):
            if frame.shape[:2] != (th, tw):
                frame = np.asarray(cv2.resize(frame, (tw, th), interpolation=cv2.INTER_AREA), np.uint8)
            vf = av.VideoFrame.from_ndarray(np.ascontiguousarray(frame), format="bgr24")
            vf.pts = i
            out.mux(stream.encode(vf))
        out.mux(stream.encode(None))
    buf.seek(0)
    with av.open(buf, mode="r") as reader:
        return [np.asarray(f.to_ndarray(format="bgr24"), np.uint8) for f in reader.decode(video=0)]


def test_mark_is_invisible_by_psnr(frames: list[Image], marked: list[Image]) -> None:
    psnr = [cv2.PSNR(a, b) for a, b in zip(frames, marked, strict=True)]
    assert min(psnr) >= 42.0
    assert all(np.any(a != b) for a, b in zip(frames, marked, strict=True))


def test_embedding_in_place_changes_the_callers_frame(frames: list[Image]) -> None:
    work = frames[0].copy()
    out = Watermarker(PAYLOAD, CODE).embed(work, inplace=True)
    assert out is work and np.any(work != frames[0])


@pytest.mark.parametrize(
    "condition",
    ["crf28", "half_size_crf23", "crop_4pct_crf23"],
)
def test_payload_survives_h264_resize_and_crop(marked: list[Image], condition: str) -> None:
    frames = marked
    if condition.startswith("crop"):
        frames = [f[29:-29, 51:-51] for f in frames]  # 4 % off every side: the tile's phase moves
    if condition == "crf28":
        decoded = h264(frames, crf=28)
    elif condition.startswith("half"):
        decoded = h264(frames, crf=23, size=(640, 360))
    else:
        decoded = h264(frames, crf=23)
    (result,) = detect_windows(decoded, CODE, window=len(decoded))
    assert result.found and result.payload == PAYLOAD
    assert result.false_positive_p < 1e-6
    if condition.startswith("half"):
        assert result.scale == 0.5


def test_mark_on_the_luma_plane_of_yuv_reads_back(frames: list[Image]) -> None:
    marker = Watermarker(PAYLOAD, CODE)
    out = []
    for frame in frames[:4]:
        yuv = cv2.cvtColor(frame, cv2.COLOR_BGR2YUV_I420)
        h = frame.shape[0]
        marker.embed_luma(yuv[:h], inplace=True)
        out.append(np.asarray(cv2.cvtColor(yuv, cv2.COLOR_YUV2BGR_I420), np.uint8))
    (result,) = detect_windows(h264(out, crf=23), CODE, window=4)
    assert result.payload == PAYLOAD


def test_unmarked_video_and_another_key_find_nothing(frames: list[Image], marked: list[Image]) -> None:
    (clean,) = detect_windows(h264(frames, crf=23), CODE, window=len(frames))
    assert not clean.found and clean.payload is None
    assert clean.statistic < clean.threshold
    (other,) = detect_windows(h264(marked, crf=23), MarkCode("another-key"), window=len(marked))
    assert not other.found


def test_bad_frames_are_refused() -> None:
    marker = Watermarker(PAYLOAD, CODE)
    with pytest.raises(ValueError, match="BGR uint8"):
        marker.embed(np.zeros((10, 10), np.uint8))
    with pytest.raises(ValueError, match="strength"):
        Watermarker(PAYLOAD, CODE, strength=0)
