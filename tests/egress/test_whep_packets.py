"""A channel's WHEP viewers take the channel's shared encode's packets (app.egress.whep, app.egress.encode): a
packet-fed hub runs no encoder of its own, reads the encode only while someone watches, and passes a viewer's
keyframe request on to it. Real encoders, a receive-only aiortc viewer on loopback, frames numbered in their
pixels so that what the viewer decodes is checked to be what was offered."""

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field

import av
import numpy as np
from aiortc import RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from app.egress.encode import EncodedPacket, SharedEncode
from app.egress.whep import Viewer, ViewerHub
from app.live.frame import OutputFrame
from app.media.encoder import EncoderPolicy
from app.media.peer import PeerConfig, use_host_addresses
from app.settings import EncoderSettings
from tests.helpers import wait_for_async

WIDTH, HEIGHT, FPS = 320, 240, 30
BITS, COLUMNS = 12, 4  # a frame's number, as black and white cells of a 4x3 grid
CELL_W, CELL_H = WIDTH // COLUMNS, HEIGHT // (BITS // COLUMNS)
SETTINGS = EncoderSettings(backend="x264", x264_preset="ultrafast", keyframe_interval_s=10.0)


def numbered(number: int) -> OutputFrame:
    image = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    for bit in range(BITS):
        if number >> bit & 1:
            row, column = divmod(bit, COLUMNS)
            image[row * CELL_H : (row + 1) * CELL_H, column * CELL_W : (column + 1) * CELL_W] = 255
    return OutputFrame(image)


def number_of(frame: av.VideoFrame) -> int:
    grey = frame.to_ndarray(format="gray")
    number = 0
    for bit in range(BITS):
        row, column = divmod(bit, COLUMNS)
        y, x = row * CELL_H + CELL_H // 2, column * CELL_W + CELL_W // 2
        if grey[y - 8 : y + 8, x - 8 : x + 8].mean() > 128:
            number |= 1 << bit
    return number


class Feed:
    """Numbered frames at `FPS` into the encode, from a thread as a channel's feed does; `offered[n]`: when."""

    def __init__(self, encode: SharedEncode) -> None:
        self.offered: dict[int, float] = {}
        self._encode = encode
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        number = 1
        while not self._stop.is_set():
            self.offered[number] = time.monotonic()
            self._encode.frame(numbered(number))
            number = number % (2**BITS - 1) + 1
            self._stop.wait(1 / FPS)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


class Collector:
    """Another reader of the encode, picture only, as the channel's RTSP path or an SRT caller is."""

    audio_codec: str | None = None

    def __init__(self) -> None:
        self.packets: list[EncodedPacket] = []

    def packet(self, packet: EncodedPacket) -> None:
        self.packets.append(packet)


@dataclass
class Watched:
    hub: ViewerHub
    encode: SharedEncode
    feed: Feed
    viewer: Viewer
    client: RTCPeerConnection
    decoded: list[tuple[int, float]] = field(default_factory=list)  # (frame number, when)
    keyframes: list[float] = field(default_factory=list)  # when the viewer's track got one


async def _decode(track: MediaStreamTrack, decoded: list[tuple[int, float]]) -> None:
    with suppress(MediaStreamError):
        while True:
            frame = await track.recv()
            assert isinstance(frame, av.VideoFrame) and (frame.width, frame.height) == (WIDTH, HEIGHT)
            decoded.append((number_of(frame), time.monotonic()))


@asynccontextmanager
async def _watching() -> AsyncIterator[Watched]:
    """A packet-fed hub of a fed encode and one aiortc viewer, which has decoded frames already."""
    use_host_addresses(["127.0.0.1"])
    encode = SharedEncode(WIDTH, HEIGHT, FPS, EncoderPolicy(SETTINGS), "whep-packets")
    hub = ViewerHub("channel/whep-packets", asyncio.get_running_loop(), PeerConfig(), EncoderPolicy(SETTINGS), encode)
    feed = Feed(encode)
    client = RTCPeerConnection()
    decoded: list[tuple[int, float]] = []
    tasks: list[asyncio.Future[None]] = []
    client.on("track", lambda track: tasks.append(asyncio.ensure_future(_decode(track, decoded))))
    try:
        await asyncio.sleep(0.5)
        assert not encode.running and encode.frames_encoded == 0 and hub.frames_sent == 0  # nobody watches
        client.addTransceiver("video", direction="recvonly")
        await client.setLocalDescription(await client.createOffer())
        viewer, answer = await hub.add_viewer(client.localDescription.sdp)
        await client.setRemoteDescription(RTCSessionDescription(answer, "answer"))
        watched = Watched(hub, encode, feed, viewer, client, decoded)
        deliver = viewer.track.deliver

        def counted(packet: av.Packet, keyframe: bool, handed_at: float | None = None) -> None:
            if keyframe:
                watched.keyframes.append(time.monotonic())
            deliver(packet, keyframe, handed_at)

        viewer.track.deliver = counted  # type: ignore[method-assign]
        assert await wait_for_async(lambda: len(decoded) >= 2 * FPS, 30.0), f"{len(decoded)} frames decoded"
        yield watched
    finally:
        for task in tasks:
            task.cancel()
        with suppress(Exception):
            await hub.close()
        await client.close()
        feed.stop()


def test_a_channel_viewer_decodes_the_frames_of_the_shared_encode_which_runs_only_while_it_watches() -> None:
    asyncio.run(_decodes_the_shared_encode())


async def _decodes_the_shared_encode() -> None:
    async with _watching() as watched:
        hub, encode = watched.hub, watched.encode
        # No encoder of the hub's own: the encode's thread is the only one.
        assert not [t for t in threading.enumerate() if t.name == f"whep-{hub.name}"]
        other = Collector()
        encoded, received = encode.frames_encoded, hub.frames_sent
        encode.attach(other)  # a second reader: the same packets, not a second encode
        assert await wait_for_async(lambda: len(other.packets) >= FPS, 10.0)
        encode.detach(other)
        assert encode.readers == 1  # the hub, for its viewer
        together = len(other.packets)
        assert abs(encode.frames_encoded - encoded - together) <= 2
        assert hub.frames_encoded == 0 and abs(hub.frames_sent - received - together) <= 2
        numbers = [number for number, _ in watched.decoded]
        # What the viewer decoded is what was offered, in order (frames between may be thinned, never reordered).
        assert set(numbers) <= set(watched.feed.offered), sorted(set(numbers) - set(watched.feed.offered))[:5]
        assert numbers == sorted(numbers)
        assert hub.frames_sent >= len(numbers) and hub.frames_sent <= encode.frames_encoded
        # The viewer leaves: the hub lets go of the encode, whose thread ends.
        await watched.viewer.request_close()
        assert await wait_for_async(lambda: not encode.running, 10.0), "the encode runs for nobody"
        received, encoded = hub.frames_sent, encode.frames_encoded
        await asyncio.sleep(0.5)
        assert (hub.frames_sent, encode.frames_encoded) == (received, encoded)
        delays = sorted(at - watched.feed.offered[n] for n, at in watched.decoded[FPS:])
        print(f"\noffered to decoded, packet-fed: p50 {1000 * delays[len(delays) // 2]:.1f} ms over {len(delays)}")


def test_a_channel_viewers_keyframe_request_reaches_the_shared_encode() -> None:
    asyncio.run(_keyframe_request())


async def _keyframe_request() -> None:
    async with _watching() as watched:
        # Past the keyframe of the viewer's joining and the encode's least interval between asked keyframes;
        # the encode's own next one is 10 s away.
        await asyncio.sleep(max(SETTINGS.keyframe_min_interval_s, 1.0) + 0.2)
        before = len(watched.keyframes)
        sender = watched.viewer.pc.getTransceivers()[0].sender
        # A real PLI, over the wire, as a player sends after a loss.
        await watched.client.getReceivers()[0]._send_rtcp_pli(sender._ssrc)
        assert await wait_for_async(lambda: watched.viewer.keyframes_asked >= 1, 5.0), "the PLI never came"
        asked = time.monotonic()
        assert await wait_for_async(lambda: len(watched.keyframes) > before, 3.0), "no keyframe for the PLI"
        assert watched.keyframes[-1] - asked < 1.5
        decoded = len(watched.decoded)
        assert await wait_for_async(lambda: len(watched.decoded) > decoded + FPS // 2, 5.0)
