"""Face regions converted alone and written back into a YUV 4:2:0 frame give what the whole-frame BGR round
trip gives (PSNR), and leave the rest of the frame exactly as decoded."""

import av
import cv2
import numpy as np
import pytest

from app.media.clips import load_sample, make_motion_clip
from app.media.yuv import detector_input, read_bgr, region, to_frame, write_bgr
from app.pipeline.types import Image


@pytest.fixture(scope="module")
def image() -> Image:
    return make_motion_clip(load_sample("astronaut"), size=(640, 480), frames=1, focus=(225.0, 118.0)).frames[0]


def yuv_frame(image: Image) -> av.VideoFrame:
    return av.VideoFrame.from_ndarray(image, format="bgr24").reformat(format="yuv420p")


def test_a_region_read_matches_the_whole_frame_conversion(image: Image) -> None:
    frame = yuv_frame(image)
    full = frame.to_ndarray(format="bgr24")
    area = region([251.3, 131.7, 390.2, 309.9], 640, 480, margin=0.1)
    assert area.x0 % 2 == 0 and area.y1 % 2 == 0 and area.width > 139 * 1.2
    assert cv2.PSNR(read_bgr(frame, area), full[area.y0 : area.y1, area.x0 : area.x1]) > 40


def test_writing_a_changed_region_back_equals_the_bgr_round_trip(image: Image) -> None:
    frame = yuv_frame(image)
    decoded = frame.to_ndarray(format="bgr24")
    area = region([250, 130, 391, 310], 640, 480, margin=0.1)
    changed = cv2.GaussianBlur(read_bgr(frame, area), (0, 0), 3)  # stands in for a swapped face
    whole = decoded.copy()
    whole[area.y0 : area.y1, area.x0 : area.x1] = changed
    by_bgr = av.VideoFrame.from_ndarray(whole, format="bgr24").reformat(format="yuv420p").to_ndarray(format="bgr24")
    write_bgr(frame, area, changed)
    by_region = frame.to_ndarray(format="bgr24")
    assert cv2.PSNR(by_bgr, by_region) > 38
    inside = (slice(area.y0, area.y1), slice(area.x0, area.x1))
    assert cv2.PSNR(by_bgr[inside], by_region[inside]) > 38
    outside = np.ones(decoded.shape[:2], bool)
    outside[inside] = False
    assert np.array_equal(by_region[outside], decoded[outside])  # untouched, no second conversion
    assert not np.array_equal(by_region[inside], decoded[inside])


def test_detector_input_is_one_scaled_conversion(image: Image) -> None:
    big = cv2.resize(image, (1280, 720))
    frame = yuv_frame(big)
    small, scale = detector_input(frame, 640)
    assert small.shape == (360, 640, 3) and scale == pytest.approx(0.5)
    reference = cv2.resize(frame.to_ndarray(format="bgr24"), (640, 360), interpolation=cv2.INTER_AREA)
    assert cv2.PSNR(small, reference) > 30


def test_wrong_sizes_and_formats_are_refused(image: Image) -> None:
    frame = yuv_frame(image)
    with pytest.raises(ValueError, match="region is"):
        write_bgr(frame, region([0, 0, 100, 100], 640, 480), np.zeros((10, 10, 3), np.uint8))
    with pytest.raises(ValueError, match="yuv420p"):
        read_bgr(av.VideoFrame.from_ndarray(image, format="bgr24"), region([0, 0, 10, 10], 640, 480))


def test_an_output_image_becomes_a_yuv420p_frame_like_the_encoders_own_conversion(image: Image) -> None:
    frame = to_frame(image)
    assert frame.format.name == "yuv420p" and (frame.width, frame.height) == (640, 480)
    by_encoder = av.VideoFrame.from_ndarray(image, format="bgr24").reformat(format="yuv420p")
    assert cv2.PSNR(frame.to_ndarray(format="bgr24"), by_encoder.to_ndarray(format="bgr24")) > 40
    odd = to_frame(np.ascontiguousarray(image[:239, :319]))  # 4:2:0 cannot hold it whole: left to the encoder
    assert odd.format.name == "bgr24" and (odd.width, odd.height) == (319, 239)
