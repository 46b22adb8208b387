"""A channel's feed on its own, with real threads and time: what goes out while a publisher sends, after it
stops (its last frame held, then the slate), and when another takes over."""

import threading
import time

import numpy as np

from app.live.channel_feed import GAP_S, ChannelFeed
from app.live.frame import OutputFrame, letterbox
from app.pipeline.types import Image
from tests.helpers import wait_for

FPS = 20
HOLD_S = 0.5


class Recorder:
    def __init__(self) -> None:
        self.frames: list[tuple[float, Image]] = []  # the images sent
        self.keyframes = 0
        self._lock = threading.Lock()

    def __call__(self, frame: OutputFrame) -> None:
        with self._lock:
            self.frames.append((time.monotonic(), frame.image))

    def keyframe(self) -> None:
        self.keyframes += 1

    def since(self, start: float) -> list[Image]:
        with self._lock:
            return [image for t, image in self.frames if t >= start]


def solid(value: int, width: int = 64, height: int = 48) -> Image:
    return np.full((height, width, 3), value, np.uint8)


def feed_with_recorder() -> tuple[ChannelFeed, Recorder]:
    feed = ChannelFeed("test", 64, 48, FPS, hold_s=HOLD_S)
    recorder = Recorder()
    feed.output_listeners.append(recorder)
    feed.keyframe_listeners.append(recorder.keyframe)
    return feed, recorder


def test_with_nobody_publishing_the_slate_goes_out_at_the_channel_rate() -> None:
    feed, recorder = feed_with_recorder()
    try:
        start = time.monotonic()
        time.sleep(1.0)
        frames = recorder.since(start)
        assert FPS * 0.6 <= len(frames) <= FPS * 1.4
        assert all(np.array_equal(f, feed.slate.image) for f in frames)
        assert feed.stats()["showing"] == "slate" and feed.stats()["seconds_on_slate"] > 0
    finally:
        feed.close()


def test_the_last_frame_is_held_then_the_slate_and_a_new_publisher_starts_on_a_keyframe() -> None:
    feed, recorder = feed_with_recorder()
    try:
        feed.attach("session/a")
        for _ in range(5):
            feed.publish("session/a", OutputFrame(solid(200)))
            time.sleep(0.02)
        assert wait_for(lambda: recorder.keyframes == 1, 5)
        stopped = time.monotonic()
        feed.detach("session/a")
        feed.publish("session/a", OutputFrame(solid(10)))  # a late frame of a publisher that has gone: not sent
        assert wait_for(lambda: any(np.array_equal(f, feed.slate.image) for f in recorder.since(stopped)), 5)
        after = recorder.since(stopped)
        held = [f for f in after if np.array_equal(f, solid(200))]
        first_slate = next(t for t, f in recorder.frames if t >= stopped and np.array_equal(f, feed.slate.image))
        assert held and not any(np.array_equal(f, solid(10)) for f in after)
        assert HOLD_S - 0.1 <= first_slate - stopped <= HOLD_S + 0.3

        feed.attach("stream/b")
        switched = time.monotonic()
        feed.publish("stream/b", OutputFrame(solid(90)))
        assert wait_for(lambda: recorder.keyframes == 2, 5)
        assert wait_for(lambda: any(np.array_equal(f, solid(90)) for f in recorder.since(switched)), 5)
        stats = feed.stats()
        assert stats["publisher"] == "stream/b" and stats["publisher_changes"] == 2
        assert [p["publisher"] for p in stats["publishers"]] == ["session/a", "stream/b"]
    finally:
        feed.close()


def test_a_newer_publisher_takes_over_and_the_older_one_is_not_heard() -> None:
    feed, recorder = feed_with_recorder()
    try:
        feed.attach("session/a")
        feed.attach("session/b")
        start = time.monotonic()
        for _ in range(int(GAP_S / 0.02) + 5):
            feed.publish("session/a", OutputFrame(solid(1)))
            feed.publish("session/b", OutputFrame(solid(2)))
            time.sleep(0.02)
        frames = recorder.since(start)
        assert frames and all(np.array_equal(f, solid(2)) for f in frames)
        feed.detach("session/a")  # the older one ending does not stop the newer
        assert feed.publisher == "session/b"
    finally:
        feed.close()


def test_frames_keep_their_shape_in_a_channel_of_another_shape() -> None:
    camera = solid(255, 640, 480)
    fitted = letterbox(camera, 1280, 720)
    assert fitted.shape == (720, 1280, 3)
    assert fitted[:, 160:1120].min() == 255 and fitted[:, :160].max() == 0 and fitted[:, 1120:].max() == 0


def test_an_output_that_fails_does_not_stop_the_others() -> None:
    feed, recorder = feed_with_recorder()

    def broken(frame: OutputFrame) -> None:
        raise RuntimeError("encoder gone")

    feed.output_listeners.insert(0, broken)
    try:
        start = time.monotonic()
        assert wait_for(lambda: len(recorder.since(start)) >= 3, 5)
        assert feed.counters.errors >= 3
    finally:
        feed.close()
