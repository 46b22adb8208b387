"""Recovery of a received stream after loss (app.media.recovery): real H.264 from the live encoder, packetised
as aiortc sends it, through the guarded jitter buffer with losses, retransmissions and outages on a clock the
test moves; keyframe requests through the limiter; and the encoder's side (requested keyframes at most once
per interval, estimates below the band followed down to the floor)."""

import asyncio
import time
from dataclasses import dataclass, field
from fractions import Fraction

import av
import pytest
from aiortc import RTCPeerConnection
from aiortc.codecs.h264 import h264_depayload
from aiortc.rtp import RtpPacket

from app.media.clips import load_sample, make_motion_clip
from app.media.encoder import LiveH264Encoder
from app.media.recovery import GuardedJitterBuffer, PliLimiter, guard_receiver, is_keyframe
from app.pipeline.types import Image
from app.settings import EncoderSettings

FRAME_S = 1 / 30


@pytest.fixture(scope="module")
def clip() -> list[Image]:
    still = load_sample("astronaut")
    return make_motion_clip(still, size=(320, 240), frames=30, focus=(112.0, 59.0), noise_sigma=3.0, seed=2).frames


@dataclass
class Stream:
    """A live encoder's output as RTP packets, frame by frame."""

    images: list[Image]
    encoder: LiveH264Encoder = field(
        default_factory=lambda: LiveH264Encoder(
            EncoderSettings(backend="x264", x264_preset="ultrafast", keyframe_interval_s=60.0, threads=1)
        )
    )
    seq: int = 65_000  # wraps during the test
    index: int = 0

    def frame(self, keyframe: bool = False) -> list[RtpPacket]:
        image = self.images[self.index % len(self.images)]
        video = av.VideoFrame.from_ndarray(image, format="bgr24")
        video.pts, video.time_base = self.index * 3000, Fraction(1, 90000)
        payloads, timestamp = self.encoder.encode(video, force_keyframe=keyframe)
        packets = []
        for i, payload in enumerate(payloads):
            packet = RtpPacket(
                payload_type=102,
                sequence_number=self.seq,
                timestamp=timestamp,
                payload=payload,
                marker=int(i == len(payloads) - 1),
            )
            packet._data = h264_depayload(payload)  # type: ignore[attr-defined] # what aiortc's receiver sets
            packets.append(packet)
            self.seq = (self.seq + 1) % 65536
        self.index += 1
        return packets


class Receiver:
    """The buffer on a clock the test moves, with a decoder for what comes out."""

    def __init__(self) -> None:
        self.now = 0.0
        self.buffer = GuardedJitterBuffer(clock=lambda: self.now)
        self.decoder = av.CodecContext.create("h264", "r")
        self.out: list[bytes] = []
        self.pli = 0

    def feed(self, packets: list[RtpPacket]) -> None:
        for packet in packets:
            pli, frame = self.buffer.add(packet)
            self.pli += pli
            if frame is not None:
                self.out.append(frame.data)
                for _ in self.decoder.decode(av.Packet(frame.data)):  # raises on what cannot be decoded
                    pass
        self.now += FRAME_S


def test_a_clean_stream_passes_through_unchanged(clip: list[Image]) -> None:
    stream, receiver = Stream(clip), Receiver()
    for _ in range(20):
        receiver.feed(stream.frame())
    assert len(receiver.out) == 19  # a frame is complete once the next one's first packet arrives
    assert is_keyframe(receiver.out[0]) and not any(is_keyframe(d) for d in receiver.out[1:])
    assert receiver.pli == 0 and receiver.buffer.counts.holes_given_up == 0


def test_a_packet_retransmitted_in_time_is_waited_for(clip: list[Image]) -> None:
    stream, receiver = Stream(clip), Receiver()
    receiver.feed(stream.frame())
    lost_frame = stream.frame()
    receiver.feed(lost_frame[1:])  # the frame's first packet is lost
    for _ in range(5):  # 167 ms of later frames
        receiver.feed(stream.frame())
    assert len(receiver.out) == 0 or len(receiver.out) == 1  # held behind the hole
    receiver.feed(lost_frame[:1])  # the retransmission
    receiver.feed(stream.frame())
    assert receiver.pli == 0 and receiver.buffer.counts.holes_given_up == 0
    assert len(receiver.out) >= 3, "frames held behind the hole come out once it is filled"


def test_a_hole_not_filled_in_time_is_given_up_and_a_keyframe_asked_for(clip: list[Image]) -> None:
    stream, receiver = Stream(clip), Receiver()
    receiver.feed(stream.frame())
    stream.frame()  # lost for good
    for _ in range(20):  # 0.67 s of later frames
        receiver.feed(stream.frame())
    counts = receiver.buffer.counts
    assert counts.holes_given_up == 1, "given up after 0.5 s, long before 512 packets came"
    assert receiver.pli > 0 and receiver.buffer.awaiting_keyframe
    passed = len(receiver.out)
    receiver.feed(stream.frame(keyframe=True))  # the sender answers
    receiver.feed(stream.frame())
    assert len(receiver.out) == passed + 1 and is_keyframe(receiver.out[-1]), "the keyframe is passed on"
    assert not receiver.buffer.awaiting_keyframe and counts.frames_dropped > 0
    receiver.feed(stream.frame())
    assert len(receiver.out) == passed + 2, "and the frames after it"


def test_after_an_outage_the_first_packet_back_asks_for_a_keyframe(clip: list[Image]) -> None:
    stream, receiver = Stream(clip), Receiver()
    for _ in range(5):
        receiver.feed(stream.frame())
    passed = len(receiver.out)
    for _ in range(90):  # 3 s sent into an outage: nothing arrives
        stream.frame()
        receiver.now += FRAME_S
    first_back = stream.frame()
    receiver.feed(first_back[:1])
    assert receiver.pli == 1 and receiver.buffer.counts.holes_given_up == 1, "at once, not after 512 packets"
    receiver.feed(first_back[1:])
    receiver.feed(stream.frame(keyframe=True))
    receiver.feed(stream.frame())
    assert len(receiver.out) == passed + 1 and is_keyframe(receiver.out[-1])


def test_keyframes_are_recognised() -> None:
    assert is_keyframe(b"\x00\x00\x00\x01\x67\x42" + b"\x00\x00\x00\x01\x65\x88")  # SPS, IDR
    assert not is_keyframe(b"\x00\x00\x00\x01\x41\x9a")  # a P slice
    assert not is_keyframe(b"\x88\x84\x21")  # the rest of an IDR slice whose first packet was lost
    assert is_keyframe(b"\x10\x02\x00\x9d\x01\x2a\x40") and not is_keyframe(b"\x31\x02\x00\x9d\x01\x2a")  # VP8


def test_keyframe_requests_leave_at_most_once_per_interval_and_an_owed_one_when_it_ends() -> None:
    asyncio.run(_limited())


async def _limited() -> None:
    sent: list[float] = []
    loop = asyncio.get_running_loop()

    async def send(_ssrc: int) -> None:
        sent.append(loop.time())

    buffer = GuardedJitterBuffer()
    limiter = PliLimiter(send, buffer, interval_s=0.2)
    start = loop.time()
    for _ in range(10):
        await limiter(1)
    assert len(sent) == 1 and buffer.counts.pli_deferred == 9
    await asyncio.sleep(0.35)
    assert len(sent) == 2 and 0.15 <= sent[1] - start <= 0.34, "the owed request leaves when the interval ends"
    buffer.last_keyframe_at = limiter._clock()  # the keyframe came
    await limiter(1)
    await asyncio.sleep(0.3)
    assert len(sent) == 2, "a keyframe made the owed request needless"
    limiter.close()


def test_the_guard_goes_on_aiortcs_video_receiver() -> None:
    asyncio.run(_guarded())


async def _guarded() -> None:
    pc = RTCPeerConnection()
    try:
        receiver = pc.addTransceiver("video").receiver
        guard = guard_receiver(receiver)
        assert guard is not None and receiver._send_rtcp_pli is guard.pli
        assert isinstance(receiver._RTCRtpReceiver__jitter_buffer, GuardedJitterBuffer)  # type: ignore[attr-defined]
        nacks: list[tuple[int, list[int]]] = []

        async def send_nack(media_ssrc: int, lost: list[int]) -> None:
            nacks.append((media_ssrc, lost))

        receiver._send_rtcp_nack = send_nack  # type: ignore[method-assign]
        for seq in (100, 102):  # 101 lost
            packet = RtpPacket(payload_type=102, sequence_number=seq, timestamp=seq, ssrc=7)
            packet._data = b"\x00\x00\x00\x01\x41"  # type: ignore[attr-defined]
            guard.buffer.add(packet)
        guard.buffer._ask_again(7, time.monotonic() + 1.0)  # as if a second had gone by
        await asyncio.sleep(0)
        assert nacks == [(7, [101])], "the missing packet is asked for again through the receiver's NACK sender"
    finally:
        await pc.close()


def test_a_packet_still_missing_is_asked_for_again_until_it_comes(clip: list[Image]) -> None:
    stream, receiver = Stream(clip), Receiver()
    asked: list[list[int]] = []
    receiver.buffer = GuardedJitterBuffer(clock=lambda: receiver.now, renack=lambda _ssrc, lost: asked.append(lost))
    receiver.feed(stream.frame())
    lost_frame = stream.frame()
    receiver.feed(lost_frame[1:])  # the frame's first packet is lost, and the first request for it too
    receiver.feed(stream.frame())
    assert asked == [], "not before RENACK_S: aiortc's receiver has just asked"
    for _ in range(4):  # 133 ms more
        receiver.feed(stream.frame())
    lost_seq = lost_frame[0].sequence_number
    assert asked and all(lost_seq in request for request in asked), "asked for again while still missing"
    assert asked[0] == [lost_seq], "only what has been missing that long"
    repeats = len(asked)
    assert receiver.buffer.counts.nacks_repeated == repeats <= 2, "at most once per RENACK_S"
    receiver.feed(lost_frame[:1])  # the repeated request's retransmission
    for _ in range(6):
        receiver.feed(stream.frame())
    assert len(asked) == repeats, "nothing more to ask for once it came"
    assert receiver.buffer.counts.holes_given_up == 0 and receiver.pli == 0
