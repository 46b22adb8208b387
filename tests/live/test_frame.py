"""One processed frame, converted to I420 once for every output that encodes it."""

import threading

import cv2
import numpy as np
import pytest

from app.live.frame import OutputFrame
from app.media.yuv import to_frame
from tests.helpers import psnr


def test_every_output_gets_the_same_conversion_made_once() -> None:
    ys, xs = np.mgrid[0:48, 0:64]
    frame = OutputFrame(np.dstack([xs * 4, ys * 5, (xs + ys) * 2]).astype(np.uint8))  # smooth: 4:2:0 keeps it
    results: list[np.ndarray] = []
    threads = [threading.Thread(target=lambda: results.append(frame.i420())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r is results[0] for r in results)  # one buffer, converted once
    expected = cv2.cvtColor(frame.image, cv2.COLOR_BGR2YUV_I420)
    assert np.array_equal(results[0], expected)
    encoded = to_frame(frame)  # what the WebRTC return and WHEP encode from
    assert encoded.format.name == "yuv420p"
    assert psnr(encoded.to_ndarray(format="bgr24"), frame.image) > 30


def test_an_odd_sized_frame_has_no_i420_form_and_is_encoded_from_bgr() -> None:
    frame = OutputFrame(np.zeros((47, 64, 3), np.uint8))
    assert not frame.even
    with pytest.raises(ValueError, match="no whole I420"):
        frame.i420()
    assert to_frame(frame).format.name == "bgr24"
    assert OutputFrame.of(frame) is frame and OutputFrame.of(frame.image).image is frame.image
