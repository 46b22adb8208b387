"""When the RTSP feeder repeats a frame and which frames it makes keyframes (pure bookkeeping)."""

import pytest

from app.media.rtsp_out.pacing import (
    KEYFRAME_FRAMES_AFTER_PLAY,
    KEYFRAME_INTERVAL_S,
    PAUSE_MAX_S,
    PAUSE_MIN_S,
    PROBE_FRAMES,
    Pacing,
)


def run(pacing: Pacing, producer_fps: float, seconds: float, start: float = 0.0) -> tuple[int, int, float]:
    """Simulate the feeder: fresh frames at `producer_fps`, repeats whenever `repeat_at` comes first.

    Returns (fresh, repeated, end time)."""
    now = start
    next_fresh = start
    fresh = repeated = 0
    while now < start + seconds:
        due = pacing.repeat_at()
        if due is not None and due < next_fresh:
            now = due
            pacing.sent(now, fresh=False, keyframe=pacing.keyframe_due(now))
            repeated += 1
        else:
            now = next_fresh
            pacing.sent(now, fresh=True, keyframe=pacing.keyframe_due(now))
            fresh += 1
            next_fresh += 1.0 / producer_fps
    return fresh, repeated, now


@pytest.mark.parametrize("producer_fps", [5.0, 12.0, 24.0, 30.0])
def test_a_flowing_producer_is_never_repeated(producer_fps: float) -> None:
    pacing = Pacing(fps=30)
    fresh, repeated, _ = run(pacing, producer_fps, 5.0)
    assert repeated == 0 and fresh >= 5.0 * producer_fps - 1
    assert pacing.mean_gap_s == pytest.approx(1.0 / producer_fps)


def test_a_paused_producer_is_repeated_at_the_announced_rate() -> None:
    pacing = Pacing(fps=30)
    _, _, end = run(pacing, 12.0, 2.0)
    pause_at = pacing.repeat_at()
    assert pause_at is not None
    assert pause_at - end == pytest.approx(3.0 / 12.0)  # three of its own frame intervals
    times = []
    now = pause_at
    for _ in range(30):
        pacing.sent(now, fresh=False, keyframe=False)
        times.append(now)
        due = pacing.repeat_at()
        assert due is not None
        now = due
    assert times[-1] - times[0] == pytest.approx(29 / 30)
    # A new frame ends the pause: no repeat until the producer pauses again.
    pacing.sent(now, fresh=True, keyframe=False)
    next_due = pacing.repeat_at()
    assert next_due is not None and next_due - now >= PAUSE_MIN_S


def test_the_pause_threshold_stays_within_bounds() -> None:
    fast, slow = Pacing(fps=60), Pacing(fps=30)
    run(fast, 60.0, 1.0)
    run(slow, 0.5, 20.0)
    assert fast.pause_after_s() == PAUSE_MIN_S
    assert slow.pause_after_s() == PAUSE_MAX_S


def test_a_new_client_gets_gaps_filled_while_it_probes_then_only_fresh_frames() -> None:
    pacing = Pacing(fps=30)
    _, _, end = run(pacing, 12.0, 1.0)
    pacing.client_started()
    started_at = pacing.frames_sent
    fresh, repeated, end = run(pacing, 12.0, 1.0, start=end)
    # FFmpeg needs PROBE_FRAMES frames to open: at 12 fps they come in ~1.2 s instead of ~3 s.
    assert pacing.frames_sent - started_at >= PROBE_FRAMES
    assert repeated > 0 and fresh + repeated >= 29
    _, repeated_after, _ = run(pacing, 12.0, 3.0, start=end)
    assert repeated_after <= 1  # at most one repeat still due when probing ended


def test_keyframes_where_a_new_client_needs_them_and_at_least_every_interval() -> None:
    pacing = Pacing(fps=30)
    keyframes: list[int] = []
    now = 0.0
    for n in range(200):
        if n == 10:
            pacing.client_started()
        keyframe = pacing.keyframe_due(now)
        if keyframe:
            keyframes.append(n)
        pacing.sent(now, fresh=True, keyframe=keyframe)
        now += 1 / 30
    after_play = [10 + k for k in KEYFRAME_FRAMES_AFTER_PLAY]
    assert set(after_play) <= set(keyframes)
    gaps = [b - a for a, b in zip(keyframes, keyframes[1:], strict=False)]
    assert max(gaps) <= KEYFRAME_INTERVAL_S * 30 + 1


def test_a_new_stream_starts_with_a_keyframe() -> None:
    pacing = Pacing(fps=30)
    run(pacing, 30.0, 0.5)
    pacing.stream_started()
    assert pacing.repeat_at() is None
    assert pacing.keyframe_due(10.0)
