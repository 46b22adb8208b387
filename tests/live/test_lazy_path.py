"""A live output's own RTSP path on its own: published once, at the first frame's size, and given up (never the
output) when it cannot be published or a push fails. The opener here records calls; the real one (the server's
RTSP output) is exercised by the server's session and stream tests."""

import logging
import threading

import av
import numpy as np
import pytest

from app.egress.encode import SharedEncode
from app.live.frame import OutputFrame
from app.live.lazy_path import LazyPath
from app.pipeline.types import Image


class Published:
    def __init__(self, width: int, height: int, audio: bool, fail_push: bool = False) -> None:
        self.size = (width, height)
        self.audio = audio
        self.fail_push = fail_push
        self.images: list[Image] = []
        self.sounds = 0
        self.closed = 0

    @property
    def encode(self) -> SharedEncode:
        raise AssertionError("not read here")

    def push(self, image: Image | OutputFrame) -> None:
        if self.fail_push:
            raise RuntimeError("the path's pipeline is gone")
        self.images.append(OutputFrame.of(image).image)

    def push_audio(self, frame: av.AudioFrame, due: float | None = None) -> None:
        self.sounds += 1

    def close(self) -> None:
        self.closed += 1


class Opener:
    def __init__(self, fail: bool = False, fail_push: bool = False) -> None:
        self.fail = fail
        self.fail_push = fail_push
        self.opened: list[Published] = []

    def __call__(self, width: int, height: int, audio: bool) -> Published:
        if self.fail:
            raise RuntimeError("RTSP output is off")
        published = Published(width, height, audio, self.fail_push)
        self.opened.append(published)
        return published


def frame(width: int = 64, height: int = 48) -> Image:
    return np.zeros((height, width, 3), np.uint8)


def test_the_first_frame_publishes_the_path_at_its_size_once() -> None:
    opener = Opener()
    path = LazyPath(opener, "session a")
    assert not path.published and not path.given_up
    path.push(frame(64, 48))
    path.push(frame(32, 24))  # the path keeps its size; the publisher letterboxes
    assert [p.size for p in opener.opened] == [(64, 48)]
    assert len(opener.opened[0].images) == 2
    path.push_audio(av.AudioFrame(format="s16", layout="mono", samples=960))
    assert opener.opened[0].sounds == 1
    path.close()
    path.push(frame())
    assert opener.opened[0].closed == 1 and len(opener.opened) == 1 and path.given_up


def test_threads_racing_to_open_publish_it_once() -> None:
    opener = Opener()
    path = LazyPath(opener, "stream b")
    threads = [threading.Thread(target=path.open, args=(64, 48)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(opener.opened) == 1 and path.published


def test_a_path_that_cannot_be_published_is_given_up_once_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    opener = Opener(fail=True)
    path = LazyPath(opener, "session c")
    with caplog.at_level(logging.ERROR, logger="app.live.lazy_path"):
        assert path.open(64, 48, audio=True) is False
        path.push(frame())  # not tried again, and nothing raised into the output
    assert path.given_up and path.encode is None
    assert [r.getMessage() for r in caplog.records] == ["session c: cannot publish its RTSP path; going on without it"]


def test_a_failing_push_closes_the_path_and_the_output_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    opener = Opener(fail_push=True)
    path = LazyPath(opener, "stream d")
    with caplog.at_level(logging.ERROR, logger="app.live.lazy_path"):
        path.push(frame())
        path.push(frame())
        path.push_audio(av.AudioFrame(format="s16", layout="mono", samples=960))
    assert path.given_up and len(opener.opened) == 1 and opener.opened[0].closed == 1
    assert opener.opened[0].sounds == 0
    assert len(caplog.records) == 1


def test_no_opener_means_no_path_and_closing_first_means_none_later() -> None:
    nothing = LazyPath(None, "stream into a channel")
    nothing.push(frame())
    assert nothing.given_up and not nothing.open(64, 48)
    opener = Opener()
    closed = LazyPath(opener, "session e")
    closed.close()
    closed.push(frame())
    assert opener.opened == [] and closed.given_up
