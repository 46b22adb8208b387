"""The hardest clip of `swapcast bench-watermark`: the busy group photo (t1) as a 2 s 720p30 clip, where picture
content hides most of the mark. Through H.264 CRF 28, and at half size, every one-second window must read."""

import pytest

from app.bench.watermark_bench import Condition, transform
from app.media.clips import load_sample, make_motion_clip
from app.provenance.code import MarkCode
from app.provenance.detect import detect_windows
from app.provenance.embed import Watermarker
from app.provenance.payload import Payload

PAYLOAD = Payload(server_id=0x0BEE, mark_id=0x5A5A5A, hour=7)
CODE = MarkCode("busy-clip-key")
FPS = 30


@pytest.mark.slow
@pytest.mark.parametrize(
    "condition",
    [Condition("h264_crf28", crf=28), Condition("half_size_h264_crf23", crf=23, scale=0.5)],
    ids=lambda c: c.name,
)
def test_every_second_of_the_busy_clip_reads(condition: Condition) -> None:
    clip = make_motion_clip(load_sample("t1"), size=(1280, 720), frames=2 * FPS, fps=FPS, noise_sigma=1.0, seed=2)
    marker = Watermarker(PAYLOAD, CODE)
    decoded, _ = transform([marker.embed(f) for f in clip.frames], condition, FPS, "veryfast")
    windows = detect_windows(decoded, CODE, window=FPS)
    assert len(windows) == 2
    for window in windows:
        assert window.found and window.payload == PAYLOAD
        assert window.statistic > 1.2 * window.threshold  # with a margin, not just over the line
        if condition.scale != 1.0:
            assert window.scale == 0.5
