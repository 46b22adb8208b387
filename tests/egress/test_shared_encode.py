"""A channel's encode for its pushes, with the real encoders: one encode for every push attached, each push from a
keyframe on, the sound in the codec each push takes, and no encode once no push is attached."""

import threading
import time
from collections.abc import Iterator

import av
import numpy as np
import pytest

from app.egress.encode import AUDIO_RATE, EncodedPacket, SharedEncode
from app.live.frame import OutputFrame
from app.media.clips import make_motion_clip
from app.media.encoder import EncoderPolicy
from app.pipeline.types import Image
from app.settings import EncoderSettings
from tests.helpers import wait_for

FPS = 15


class Collector:
    def __init__(self, audio_codec: str) -> None:
        self.audio_codec = audio_codec
        self.packets: list[EncodedPacket] = []

    def packet(self, packet: EncodedPacket) -> None:
        self.packets.append(packet)

    def video(self) -> list[EncodedPacket]:
        return [p for p in self.packets if p.video]


@pytest.fixture
def encode(astronaut: Image) -> Iterator[SharedEncode]:
    """An encode fed a moving face and a tone at the channel's rate, as the channel's feed would."""
    clip = make_motion_clip(astronaut, size=(320, 240), frames=2 * FPS, fps=FPS)
    height, width = clip.frames[0].shape[:2]
    encode = SharedEncode(width, height, FPS, EncoderPolicy(EncoderSettings()), "test")
    stop = threading.Event()

    def feed() -> None:
        tick = 0
        while not stop.is_set():
            encode.frame(OutputFrame(clip.frames[tick % len(clip.frames)]))
            tone = np.full((2, AUDIO_RATE // FPS), 0.1, np.float32)
            audio = av.AudioFrame.from_ndarray(tone, format="fltp", layout="stereo")
            audio.sample_rate = AUDIO_RATE
            encode.audio(audio, 0.0)
            tick += 1
            stop.wait(1 / FPS)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    yield encode
    stop.set()
    thread.join()


def test_pushes_attached_share_the_packets_each_from_a_keyframe_on(encode: SharedEncode) -> None:
    first, later, whip = Collector("aac"), Collector("aac"), Collector("libopus")
    encode.attach(first)
    assert wait_for(lambda: len(first.video()) >= 1.3 * FPS, 30)  # inside the 2 s keyframe interval
    ticks_at_join = len(first.video())
    encode.attach(later)
    encode.attach(whip)
    assert wait_for(lambda: len(later.video()) >= 2 * FPS and len(whip.video()) >= 2 * FPS, 30)
    for push in (first, later, whip):
        encode.detach(push)
    assert first.packets[0].video and first.packets[0].keyframe
    for joined in (later, whip):
        assert joined.packets[0].video and joined.packets[0].keyframe  # nothing before it, sound included
        # The very packets the first push got from there on: one encode, not one per push.
        video = first.video()
        start = next(i for i, p in enumerate(video) if p is joined.packets[0])
        shared = min(len(video) - start, len(joined.video()))
        assert shared >= FPS and all(
            a is b for a, b in zip(video[start : start + shared], joined.video(), strict=False)
        )
    # A keyframe for the pushes that joined, asked for: within a few ticks, not up to the 2 s interval.
    assert later.packets[0].pts_us <= (ticks_at_join + FPS // 3) * 1_000_000 / FPS
    # The sound in each push's codec, on the video's clock.
    assert {p.codec for p in later.packets if not p.video} == {"aac"}
    assert {p.codec for p in whip.packets if not p.video} == {"libopus"}
    audio = [p.pts_us for p in first.packets if not p.video]
    assert audio == sorted(audio) and abs(audio[-1] - first.video()[-1].pts_us) < 500_000


def test_no_push_attached_no_encode(encode: SharedEncode) -> None:
    push = Collector("aac")
    encode.attach(push)
    assert wait_for(lambda: len(push.video()) >= 3, 30)
    encode.detach(push)
    assert wait_for(lambda: not encode.running, 10)
    got = len(push.packets)
    time.sleep(0.5)
    assert len(push.packets) == got
    again = Collector("aac")
    encode.attach(again)  # a new run: a new encoder, starting on a keyframe
    assert wait_for(lambda: len(again.video()) >= 3, 30)
    encode.detach(again)
    assert again.packets[0].keyframe


class Failing(Collector):
    """A reader that takes a few packets, then raises on every one."""

    def __init__(self, after: int) -> None:
        super().__init__("aac")
        self.after = after

    def packet(self, packet: EncodedPacket) -> None:
        if len(self.packets) >= self.after:
            raise RuntimeError("this reader broke")
        super().packet(packet)


def test_a_reader_that_raises_is_detached_and_the_others_go_on(encode: SharedEncode) -> None:
    broken, healthy = Failing(after=3), Collector("aac")
    encode.attach(broken)
    encode.attach(healthy)
    assert wait_for(lambda: encode.reader_errors == 1 and len(healthy.video()) >= FPS, 30)
    assert encode.readers == 1 and encode.running
    got = len(broken.packets)
    assert wait_for(lambda: len(healthy.video()) >= 2 * FPS, 30)
    encode.detach(healthy)
    assert len(broken.packets) == got == 3 and encode.reader_errors == 1


def test_frames_faster_than_the_rate_are_thinned_to_its_slots(astronaut: Image) -> None:
    """A publisher at twice the rendition's rate: at most one frame per slot of 1/fps, stamped on that grid."""
    encode = SharedEncode(160, 120, FPS, EncoderPolicy(EncoderSettings()), "fast")
    reader = Collector("aac")
    encode.attach(reader)
    frames = [OutputFrame(np.ascontiguousarray(np.roll(astronaut[:120, :160], i, axis=1))) for i in range(8)]
    started = time.monotonic()
    tick = 0
    while time.monotonic() - started < 2.0:
        encode.frame(frames[tick % len(frames)])
        tick += 1
        time.sleep(1 / (2 * FPS))
    encode.detach(reader)
    elapsed = time.monotonic() - started
    slots = [round(p.pts_us * FPS / 1_000_000) for p in reader.video()]
    assert all(abs(p.pts_us - s * 1_000_000 / FPS) < 1000 for p, s in zip(reader.video(), slots, strict=True))
    assert slots == sorted(set(slots))  # one frame per slot at most, in order
    assert len(slots) <= elapsed * FPS + 2 and len(slots) >= 0.6 * elapsed * FPS


def test_a_frame_of_another_shape_is_letterboxed() -> None:
    """A 4:3 frame in a 16:9 rendition keeps its shape, on black bars (one size rule for every output)."""
    encode = SharedEncode(320, 180, FPS, EncoderPolicy(EncoderSettings()), "shape")
    reader = Collector("aac")
    encode.attach(reader)
    grey = OutputFrame(np.full((240, 320, 3), 200, np.uint8))
    for _ in range(FPS):
        encode.frame(grey)
        time.sleep(1 / FPS)
    assert wait_for(lambda: len(reader.video()) >= 3, 30)
    encode.detach(reader)
    decoder = av.CodecContext.create("h264", "r")
    pictures = [f for p in reader.video() for f in decoder.decode(av.Packet(p.data))]
    image = pictures[0].to_ndarray(format="bgr24")
    assert image.shape == (180, 320, 3)
    assert image[:, :40].mean() < 20 and image[:, -40:].mean() < 20  # the bars, left and right
    assert abs(float(image[:, 100:220].mean()) - 200) < 12


def test_keyframes_asked_within_the_minimum_interval_leave_once(astronaut: Image) -> None:
    """Readers asking at once (a viewer's PLI, a new RTSP client, a push retrying) get one keyframe between them,
    at most one per `keyframe_min_interval_s`."""
    settings = EncoderSettings(keyframe_min_interval_s=1.0, keyframe_interval_s=10.0)
    encode = SharedEncode(160, 120, FPS, EncoderPolicy(settings), "asked")
    reader = Collector("aac")
    encode.attach(reader)
    frame = OutputFrame(np.ascontiguousarray(astronaut[:120, :160]))
    started = time.monotonic()
    while time.monotonic() - started < 2.5:
        encode.frame(frame)
        encode.keyframe()  # asked with every frame
        time.sleep(1 / FPS)
    encode.detach(reader)
    keyframes = [p.pts_us for p in reader.video() if p.keyframe]
    # The first (attaching), then one per second however often asked.
    assert 2 <= len(keyframes) <= 4, keyframes
    assert all(b - a >= 900_000 for a, b in zip(keyframes, keyframes[1:], strict=False))


class Stamped(Collector):
    """Notes when each video packet reached it."""

    def __init__(self) -> None:
        super().__init__("aac")
        self.arrived: list[float] = []

    def packet(self, packet: EncodedPacket) -> None:
        super().packet(packet)
        if packet.video:
            self.arrived.append(time.monotonic())


def test_each_video_packet_says_when_its_frame_was_handed_over_not_when_it_was_encoded(astronaut: Image) -> None:
    """What the RTSP path stamps the picture with: the instant the output handed the frame over, which the encode
    and its queue come after (a reader that stamped on arrival would put their time between picture and sound)."""
    frame = OutputFrame(make_motion_clip(astronaut, size=(320, 240), frames=1, fps=FPS).frames[0])
    encode = SharedEncode(320, 240, FPS, EncoderPolicy(EncoderSettings()), "test")
    reader = Stamped()
    encode.attach(reader)
    handed: list[tuple[float, float]] = []
    try:
        for _ in range(2 * FPS):
            before = time.monotonic()
            encode.frame(frame)
            handed.append((before, time.monotonic()))
            time.sleep(1 / FPS)
        assert wait_for(lambda: len(reader.arrived) >= FPS, 10)
    finally:
        encode.detach(reader)
    stamps = []
    for packet, arrived in zip(reader.video(), reader.arrived, strict=True):
        at = packet.handed_at
        assert at is not None and any(before <= at <= after for before, after in handed), (at, handed)
        assert at < arrived  # the encode took its time after the hand-over
        stamps.append(at)
    assert stamps == sorted(set(stamps))  # each frame its own instant, in order
