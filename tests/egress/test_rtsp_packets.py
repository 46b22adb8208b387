"""A packet-fed RTSP path over loopback: a real gst-rtsp-server serving a real `SharedEncode`'s H.264 (libx264 or
NVENC through PyAV), pulled by real clients (PyAV, ffprobe).

The encode is fed views of a real face with each frame's id stamped into the top edge, as a channel's feed
would feed it; a client reads the id back from each decoded frame. Nothing is encoded while nobody plays the
path, and every client, the second one included, gets the picture.
"""

import json
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator

import av
import numpy as np
import pytest

from app.bench.rtsp_latency import read_frame_id, stamp_frame_id
from app.egress.encode import SharedEncode
from app.egress.rtsp import RtspPublisher, RtspServer, rtsp_unavailable_reason
from app.egress.rtsp.packet_feed import PLAY_GRACE_S, PacketFeed
from app.live.frame import OutputFrame
from app.media.clips import MotionClip, load_sample, make_motion_clip
from app.media.encoder import EncoderPolicy
from app.pipeline.types import Image
from app.settings import EncoderSettings
from tests.av_offset import PULL_OPTIONS, flash_level, pull_onsets, tone_frame
from tests.egress.rtsp_clients import pull
from tests.helpers import psnr, wait_for

UNAVAILABLE = rtsp_unavailable_reason()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"GStreamer RTSP unavailable: {UNAVAILABLE}")
FPS = 30
WIDTH, HEIGHT = 640, 480


@pytest.fixture(scope="module")
def server() -> Iterator[RtspServer]:
    with RtspServer(port=0) as s:
        yield s


@pytest.fixture(scope="module")
def clip() -> MotionClip:
    return make_motion_clip(load_sample("astronaut"), size=(WIDTH, HEIGHT), frames=2 * FPS, fps=FPS)


class EncodeFeeder:
    """Offers stamped clip frames to `encode` at `FPS` from a thread, as a channel's feed does (whether or not
    anything reads the encode)."""

    def __init__(self, encode: SharedEncode, clip: MotionClip) -> None:
        self.encode = encode
        self.clip = clip
        self.offered: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def reference(self, frame_id: int) -> Image:
        return stamp_frame_id(self.clip.frames[frame_id % len(self.clip)].copy(), frame_id)

    def _run(self) -> None:
        next_at = time.monotonic()
        frame_id = 0
        while not self._stop.is_set():
            frame = OutputFrame(self.reference(frame_id))
            self.offered[frame_id] = time.monotonic()
            self.encode.frame(frame)
            frame_id += 1
            next_at += 1 / FPS
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def __enter__(self) -> "EncodeFeeder":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def encode() -> SharedEncode:
    return SharedEncode(WIDTH, HEIGHT, FPS, EncoderPolicy(EncoderSettings()), "rtsp-test")


@pytest.fixture
def path(server: RtspServer, encode: SharedEncode, request: pytest.FixtureRequest) -> Iterator[RtspPublisher]:
    # The size and rate asked for are the encode's, whatever is passed.
    publisher = server.publish(request.node.name, 320, 240, 15, encode=encode)
    yield publisher
    publisher.close()


def packets(publisher: RtspPublisher) -> PacketFeed:
    feed = publisher.feed
    assert isinstance(feed, PacketFeed)
    return feed


def check_frames(frames: list[tuple[float, Image]], feeder: EncodeFeeder) -> list[int]:
    """The ids of `frames`, each checked against the frame offered with it; they must advance."""
    ids = []
    for _, image in frames:
        assert image.shape == (HEIGHT, WIDTH, 3)
        frame_id = read_frame_id(image)
        assert frame_id is not None and frame_id in feeder.offered
        assert psnr(image, feeder.reference(frame_id)) > 28.0
        ids.append(frame_id)
    assert ids == sorted(ids) and len(set(ids)) >= 0.9 * len(ids), ids
    return ids


def latency_ms(frames: list[tuple[float, Image]], feeder: EncodeFeeder) -> list[float]:
    out = []
    for at, image in frames:
        frame_id = read_frame_id(image)
        if frame_id is not None and frame_id in feeder.offered:
            out.append((at - feeder.offered[frame_id]) * 1000.0)
    return out


@pytest.mark.slow
def test_a_client_gets_the_encodes_frames_and_nothing_is_encoded_unwatched(
    server: RtspServer, encode: SharedEncode, path: RtspPublisher, clip: MotionClip
) -> None:
    assert (path.width, path.height, path.fps) == (WIDTH, HEIGHT, FPS)
    with EncodeFeeder(encode, clip) as feeder:
        path.push(clip.frames[0])  # frames reach a packet-fed path through its encode: nothing happens
        time.sleep(1.0)
        assert (encode.running, encode.frames_encoded, packets(path).reading) == (False, 0, False)
        frames = pull(server.url(path.path), 60)
        ids = check_frames(frames[-30:], feeder)
        assert encode.frames_encoded >= 60 and packets(path).packets_sent >= 60
        assert packets(path).errors == 0
        # The client left: the path stops reading, and the encode, its only reader, stops.
        assert wait_for(lambda: not encode.running, 5 + PLAY_GRACE_S)
        assert not packets(path).reading
        encoded = encode.frames_encoded
        time.sleep(0.5)
        assert encode.frames_encoded == encoded
    ms = latency_ms(frames[-30:], feeder)
    print(f"packet path 640x480@30: frames {ids[0]}..{ids[-1]}, offered-to-decoded p50 {np.percentile(ms, 50):.1f} ms")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("ffprobe") is None, reason="ffprobe not installed")
def test_ffprobe_sees_h264_at_the_encodes_size(
    server: RtspServer, encode: SharedEncode, path: RtspPublisher, clip: MotionClip
) -> None:
    with EncodeFeeder(encode, clip):
        out = subprocess.run(
            ["ffprobe", "-v", "error", "-rtsp_transport", "tcp", "-show_streams", "-of", "json", server.url(path.path)],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        (stream,) = json.loads(out.stdout)["streams"]
        assert (stream["codec_name"], stream["width"], stream["height"]) == ("h264", WIDTH, HEIGHT)
        assert wait_for(lambda: not encode.running, 5 + PLAY_GRACE_S)


@pytest.mark.slow
def test_a_second_client_that_joins_gets_the_picture(
    server: RtspServer, encode: SharedEncode, path: RtspPublisher, clip: MotionClip
) -> None:
    url = server.url(path.path)
    first: list[tuple[float, Image]] = []
    joined = threading.Event()

    def first_client() -> None:
        first.extend(pull(url, 150, on_frame=lambda n: joined.set() if n == 30 else None))

    with EncodeFeeder(encode, clip) as feeder:
        thread = threading.Thread(target=first_client, daemon=True)
        thread.start()
        assert joined.wait(20)
        assert wait_for(lambda: server.client_count(path.path) == 1, 5)
        runs = encode.runs
        connect = time.monotonic()
        second = pull(url, 30)
        thread.join(30)
        assert encode.runs == runs  # the second client took the same encode's packets
        check_frames(second, feeder)
        check_frames(first[-30:], feeder)
        assert len(first) == 150
    print(f"second client: first frame {second[0][0] - connect:.2f} s after it connected")


@pytest.mark.slow
def test_audio_beside_the_encodes_picture(server: RtspServer, encode: SharedEncode) -> None:
    publisher = server.publish("packets-with-audio", WIDTH, HEIGHT, FPS, encode=encode, audio=True)
    stop = threading.Event()
    start = time.monotonic() + 0.1

    def video() -> None:
        n = 0
        while not stop.is_set():
            stop.wait(max(0.0, start + n / FPS - time.monotonic()))
            encode.frame(OutputFrame(np.full((HEIGHT, WIDTH, 3), flash_level(n / FPS, FPS), np.uint8)))
            n += 1

    def audio() -> None:
        sample = 0
        while not stop.is_set():
            stop.wait(max(0.0, start + sample / 48000 - time.monotonic()))
            publisher.push_audio(tone_frame(sample, 960))
            sample += 960

    threads = [threading.Thread(target=f, daemon=True) for f in (video, audio)]
    try:
        for thread in threads:
            thread.start()
        with av.open(server.url("packets-with-audio"), options=PULL_OPTIONS, timeout=(15.0, 10.0)) as container:
            assert sorted(s.type for s in container.streams) == ["audio", "video"]
        onsets = pull_onsets(server.url("packets-with-audio"), 3.5)
        offsets = onsets.offsets_ms()
        print(f"packet path A/V offsets, ms (audio minus video): {offsets}")
        assert len(offsets) >= 2, (onsets.flashes, onsets.tones)
        assert abs(float(np.median(offsets))) <= 40.0, offsets  # as on an x264enc path (test_rtsp_audio)
        feed = publisher.audio
        assert feed is not None and feed.chunks_sent > 100 and feed.errors == 0
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        publisher.close()
