"""Audio in the RTSP output: a path published with audio carries an Opus stream that a PyAV client (what OBS's
media source is built on) decodes next to the video, with flashes and tone bursts pushed together played
together (compared by presentation time); a path without audio stays video only."""

import threading
import time
from collections.abc import Iterator
from typing import Any

import av
import numpy as np
import pytest

from app.egress.rtsp import RtspPublisher, RtspServer, rtsp_unavailable_reason
from app.egress.rtsp.audio_feed import AudioFeed, audio_launch_fragment
from app.egress.rtsp.bindings import load_bindings
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


class CountedFeed(AudioFeed):
    """Counts what the feeder thread hands the appsrc, one call per wake-up."""

    sends = 0

    def _send(self, item: tuple[Any, list[tuple[float, bytes]], bool]) -> None:
        self.sends += 1
        super()._send(item)


def test_a_quiet_path_fills_in_silence_a_chunk_at_a_time_without_spinning() -> None:
    gst, _ = load_bindings()
    assert gst is not None
    pipeline = gst.Gst.parse_launch(f"{audio_launch_fragment()} ! fakesink")
    pipeline.set_state(gst.Gst.State.PLAYING)
    feed = CountedFeed(gst, "/quiet")
    try:
        feed.attach(pipeline.get_by_name("asrc"))
        feed.set_watchers(1)  # a client plays the path; no audio comes (no microphone, or a muted one)
        time.sleep(1.0)
        sends, silence = feed.sends, feed.silence_sent
    finally:
        feed.close()
        feed.join(2.0)
        pipeline.set_state(gst.Gst.State.NULL)
    assert silence >= 30, silence  # the stream never stalls: about 50 chunks of 20 ms in a second
    # One wake-up per chunk at most (it spun before: thousands a second, a third of a core per quiet path).
    assert sends <= 70, sends
