"""The viewers' sound held back by as long as their picture takes to reach them, in order."""

import asyncio

import av
import numpy as np

from app.egress.whep_audio import FOLLOW_AT_MOST_S, PictureDelay


def tone(samples: int = 960) -> av.AudioFrame:
    frame = av.AudioFrame.from_ndarray(np.zeros((1, samples), np.int16), format="s16", layout="mono")
    frame.sample_rate = 48000
    return frame


def test_the_sound_waits_as_long_as_the_picture_takes_and_keeps_its_order() -> None:
    async def run() -> tuple[list[tuple[float, av.AudioFrame]], list[tuple[float, av.AudioFrame]], float]:
        loop = asyncio.get_running_loop()
        out: list[tuple[float, av.AudioFrame]] = []
        delay = PictureDelay(loop, lambda frame: out.append((loop.time(), frame)))
        quick = tone()
        delay.offer(quick)  # the picture has taken nothing yet: at once
        assert out == [(out[0][0], quick)]
        for _ in range(40):
            delay.picture_took(0.12)
        offered = []
        for _ in range(5):
            frame = tone()
            offered.append((loop.time(), frame))
            delay.offer(frame)
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.3)
        delay.close()
        return offered, out[1:], delay.delay_s

    offered, released, followed = asyncio.run(run())
    assert abs(followed - 0.12) < 0.01
    assert [f for _, f in released] == [f for _, f in offered]  # all of it, in order
    for (at, _), (out_at, _) in zip(offered, released, strict=True):
        assert out_at - at >= followed - 0.005  # held back by the picture's delay


def test_a_stalled_picture_holds_the_sound_back_no_more_than_the_cap_and_a_smaller_delay_never_reorders() -> None:
    async def run() -> tuple[list[int], float]:
        loop = asyncio.get_running_loop()
        out: list[int] = []
        frames = [tone(960 + i) for i in range(3)]
        delay = PictureDelay(loop, lambda frame: out.append(frame.samples - 960))
        for _ in range(60):
            delay.picture_took(30.0)
        capped = delay.delay_s
        delay.offer(frames[0])
        for _ in range(60):
            delay.picture_took(0.0)  # the picture caught up: what comes next is due sooner...
        delay.offer(frames[1])
        delay.offer(frames[2])
        await asyncio.sleep(0.05)
        assert out == []  # ...but never before what was held
        delay.close()
        return out, capped

    out, capped = asyncio.run(run())
    assert capped <= FOLLOW_AT_MOST_S
    assert out == []  # closing drops what was held
