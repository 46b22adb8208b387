"""Audio in the RTSP output: a path published with audio carries an Opus stream that a PyAV client (what OBS's
media source is built on) decodes next to the video, with flashes and tone bursts pushed together played
together (compared by presentation time); a path without audio stays video only."""

import threading
import time
from collections.abc import Iterator

import av
import numpy as np
import pytest

from app.egress.rtsp import RtspPublisher, RtspServer, rtsp_unavailable_reason
from tests.av_offset import PULL_OPTIONS, flash_level, pull_onsets, tone_frame

UNAVAILABLE = rtsp_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")
FPS = 15
CHUNK = 960  # 20 ms at 48 kHz


@pytest.fixture(scope="module")
def server() -> Iterator[RtspServer]:
    with RtspServer(port=0) as s:
        yield s


class FlashAndTone:
    """Pushes a flash every second and a tone burst at the same instants, from two threads, as a session would."""

    def __init__(self, publisher: RtspPublisher) -> None:
        self.publisher = publisher
        self.start = time.monotonic() + 0.1
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=f, daemon=True) for f in (self._video, self._audio)]

    def _video(self) -> None:
        n = 0
        while not self._stop.is_set():
            self._stop.wait(max(0.0, self.start + n / FPS - time.monotonic()))
            self.publisher.push(np.full((240, 320, 3), flash_level(n / FPS, FPS), np.uint8))
            n += 1

    def _audio(self) -> None:
        sample = 0
        while not self._stop.is_set():
            self._stop.wait(max(0.0, self.start + sample / 48000 - time.monotonic()))
            self.publisher.push_audio(tone_frame(sample, CHUNK))
            sample += CHUNK

    def __enter__(self) -> "FlashAndTone":
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()


@pytest.mark.slow
def test_audio_pushed_with_the_frames_plays_in_sync_with_them(server: RtspServer) -> None:
    publisher = server.publish("with-audio", 320, 240, FPS, audio=True)
    try:
        with FlashAndTone(publisher):
            onsets = pull_onsets(server.url("with-audio"), 3.5)
        offsets = onsets.offsets_ms()
        print(f"A/V offsets, ms (audio minus video): {offsets}")
        assert len(offsets) >= 2, (onsets.flashes, onsets.tones)
        assert abs(float(np.median(offsets))) <= 40.0, offsets
        feed = publisher.audio
        assert feed is not None and feed.chunks_sent > 100 and feed.errors == 0
    finally:
        publisher.close()


@pytest.mark.slow
def test_a_path_without_audio_has_only_video(server: RtspServer) -> None:
    publisher = server.publish("video-only", 320, 240, FPS)
    try:
        publisher.push(np.zeros((240, 320, 3), np.uint8))
        with av.open(server.url("video-only"), options=PULL_OPTIONS, timeout=(15.0, 10.0)) as container:
            assert [s.type for s in container.streams] == ["video"]
        publisher.push_audio(tone_frame(0, CHUNK))  # ignored, no error
        assert publisher.audio is None
    finally:
        publisher.close()
