"""A channel's encode for its pushes, with the real encoders: one encode for every push attached, each push from a
keyframe on, the sound in the codec each push takes, and no encode once no push is attached."""

import threading
import time
from collections.abc import Iterator

import av
import numpy as np
import pytest

from app.live.frame import OutputFrame
from app.media.clips import make_motion_clip
from app.media.encoder import EncoderPolicy
from app.media.push_encode import AUDIO_RATE, EncodedPacket, PushEncode
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
def encode(astronaut: Image) -> Iterator[PushEncode]:
    """An encode fed a moving face and a tone at the channel's rate, as the channel's feed would."""
    clip = make_motion_clip(astronaut, size=(320, 240), frames=2 * FPS, fps=FPS)
    height, width = clip.frames[0].shape[:2]
    encode = PushEncode(width, height, FPS, EncoderPolicy(EncoderSettings()), "test")
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


def test_pushes_attached_share_the_packets_each_from_a_keyframe_on(encode: PushEncode) -> None:
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


def test_no_push_attached_no_encode(encode: PushEncode) -> None:
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
