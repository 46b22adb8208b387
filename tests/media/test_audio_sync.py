"""A session's held-back sound reaches its outputs when due whether or not the return's sender asks for it, and
the return gets its own copy with continuous timestamps."""

import asyncio
import time

import av
import numpy as np

from app.media.audio_sync import RETURN_MAX_FRAMES, DelayedAudioTrack

SAMPLES = 960


def frame(value: int) -> av.AudioFrame:
    out = av.AudioFrame.from_ndarray(np.full((1, SAMPLES), value, np.int16), format="s16", layout="mono")
    out.sample_rate = 48000
    return out


def test_outputs_get_each_frame_when_due_while_the_return_takes_nothing_and_the_return_keeps_the_newest() -> None:
    async def run() -> tuple[list[tuple[int, float, float]], list[av.AudioFrame], DelayedAudioTrack]:
        track = DelayedAudioTrack(lambda: 0.05)
        out: list[tuple[int, float, float]] = []  # (value, due, when it came)
        track.outputs.append(lambda f, due: out.append((int(f.to_ndarray()[0, 0]), due, time.monotonic())))
        for value in range(RETURN_MAX_FRAMES + 10):  # nobody calls recv meanwhile (a stalled return)
            track.push(frame(value), time.monotonic())
            await asyncio.sleep(0.002)
        await asyncio.sleep(0.15)
        returned = [await track.recv() for _ in range(RETURN_MAX_FRAMES)]
        track.stop()
        return out, returned, track

    out, returned, track = asyncio.run(run())
    assert [value for value, _, _ in out] == list(range(RETURN_MAX_FRAMES + 10))  # all of it, in order
    for _, due, came in out:
        assert came >= due  # never before it is due
    # The return keeps the newest RETURN_MAX_FRAMES, restamped end to end from 0.
    assert [int(f.to_ndarray()[0, 0]) for f in returned] == list(range(10, RETURN_MAX_FRAMES + 10))
    assert [f.pts for f in returned] == [i * SAMPLES for i in range(RETURN_MAX_FRAMES)]
    assert track.dropped == 10


def test_the_return_restamps_a_copy_and_leaves_the_outputs_frame_alone() -> None:
    async def run() -> tuple[av.AudioFrame, av.AudioFrame]:
        track = DelayedAudioTrack(lambda: 0.0)
        held: list[av.AudioFrame] = []
        track.outputs.append(lambda f, due: held.append(f))
        original = frame(7)
        original.pts = None
        track.push(original, time.monotonic())
        returned = await track.recv()
        track.stop()
        return held[0], returned

    held, returned = asyncio.run(run())
    assert returned is not held and held.pts is None and returned.pts == 0
    assert int(returned.to_ndarray()[0, 0]) == 7
