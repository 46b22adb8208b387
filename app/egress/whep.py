"""WHEP viewers: any number of WebRTC viewers pull one swapped output, encoded once.

A `ViewerHub` belongs to one output (a session, a stream or a channel). A session's or a stream's hub encodes
by itself: frames are offered from any thread; only the newest waits (a `Mailbox`), and one encoder thread turns
it into H.264 (the encoder policy's shared encode: NVENC or libx264 ultrafast, baseline, no B-frames;
app.media.encoder) only while someone watches. A channel's hub encodes nothing: it reads the channel's one
`SharedEncode` (app.egress.encode), attached while someone watches, and takes its H.264 packets as they are, the
very packets the channel's other readers get. Either way each encoded frame goes to every viewer's
`EncodedVideoTrack` as an `av.Packet`, which aiortc's sender packetizes without encoding again (`RTCRtpSender`
hands packets to the codec's `pack`): one encode however many viewers, instead of one aiortc encoder per viewer.

A viewer that falls behind (its queue is full) drops what it holds and waits for the next keyframe, which
it asks for; a new viewer asks for one too, and there is one at least every keyframe interval. A viewer's
keyframe request (PLI/FIR: after loss or an outage) is passed to the hub, at most once per
`SWAPCAST_ENCODER_KEYFRAME_MIN_INTERVAL_S` per viewer, the one keyframe setting every encode throttles its
requests by (aiortc's sender forgets requests for packets it did not encode; every viewer gets the keyframe one
asked for).

A viewer may be any receiver (OBS, a player, a script), so its video sender bounds its freezes under loss by
itself, as a session's does (app.media.sender_recovery): every packet asked for is resent from the sender's own
history, and while the viewer reports loss it is made to ask again for packets still missing. A viewer that
cannot ask for packets (no NACK negotiated) asks the shared encode for a keyframe every
`LOSS_KEYFRAME_INTERVAL_S` while it reports loss (`Viewer.deliver`), which every viewer then gets.

A viewer's connection is a peer like a session's (`app.media.peer`): its offer is checked and its candidates
capped, its ICE bounded, its answer advertises the server's public address, and it is let go when ICE does not
complete within the ICE timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import threading
import time
from collections.abc import Callable
from fractions import Fraction

import av
from av.video.codeccontext import VideoCodecContext

from app.egress.encode import EncodedPacket, SharedEncode
from app.egress.whep_audio import EncodedAudioTrack, PictureDelay, SharedOpusEncoder
from app.live.frame import OutputFrame
from app.media.encoder import LOSS_KEYFRAME_WHILE_S, EncoderPolicy
from app.media.ice_bounds import BoundedIce
from app.media.mailbox import Mailbox
from app.media.packet_track import PacketTrack
from app.media.peer import (
    OfferError,
    PeerConfig,
    Role,
    answer_offer,
    check_offer,
    codec_preferences,
    ice_up,
    peer_connection,
)
from app.media.sender_recovery import SenderRecovery, recover_sender
from app.media.yuv import to_frame
from app.settings import EncoderSettings

log = logging.getLogger(__name__)

VIDEO_TIME_BASE = Fraction(1, 90000)
MICROSECONDS = 1_000_000
# Encoded frames a viewer may hold before it counts as behind (~0.25 s at 30 fps).
VIEWER_QUEUE_FRAMES = 8
PC_CLOSE_TIMEOUT_S = 5.0
# A viewer whose connection is not up by then is let go (it answered but never connected).
CONNECT_TIMEOUT_S = 20.0


class EncodedVideoTrack(PacketTrack):
    """One viewer's video: the hub's encoded frames, in order, from a keyframe on. `sent_after` is told, as each
    leaves for the viewer's sender, how long after its hand-over by the output it does."""

    kind = "video"

    def __init__(self, request_keyframe: Callable[[], None], sent_after: Callable[[float], None]) -> None:
        super().__init__()
        self._request_keyframe = request_keyframe
        self._sent_after = sent_after
        self._handed: dict[int, float] = {}  # id of a queued packet -> when its frame was handed over
        self._synced = False  # a keyframe was queued since the last gap

    async def recv(self) -> av.Packet:
        packet = await super().recv()
        handed_at = self._handed.pop(id(packet), None)
        if handed_at is not None:
            self._sent_after(time.monotonic() - handed_at)
        return packet

    def deliver(self, packet: av.Packet, keyframe: bool, handed_at: float | None = None) -> None:
        """On the event loop: queue `packet`, or drop it until the next keyframe when behind."""
        if self.readyState != "live":
            return
        if keyframe:
            self._synced = True
        if not self._synced:
            self.packets_dropped += 1
            return
        if self._queue.qsize() >= VIEWER_QUEUE_FRAMES:
            self.packets_dropped += self._queue.qsize() + 1
            while not self._queue.empty():
                self._queue.get_nowait()
            self._handed.clear()
            self._synced = False
            self._request_keyframe()
            return
        if handed_at is not None:
            self._handed[id(packet)] = handed_at
        self._queue.put_nowait(packet)


class Viewer:
    """One WHEP viewer: its peer connection and its track."""

    def __init__(self, hub: ViewerHub, peer: PeerConfig) -> None:
        self.id = secrets.token_hex(16)
        self.hub = hub
        self.track = EncodedVideoTrack(hub.request_keyframe, hub.picture_took)
        self.audio: EncodedAudioTrack | None = None  # when the offer takes audio
        self.peer = peer
        self.pc = peer_connection(peer.ice_servers)
        self.ice = BoundedIce(peer.ice_bounds)
        self.created = time.monotonic()
        self._closing: asyncio.Task[None] | None = None
        self.keyframes_asked = 0  # the viewer's keyframe requests passed to the hub
        self._last_asked: float | None = None
        self.recovery: SenderRecovery | None = None  # its video sender's (app.media.sender_recovery)
        self._loss_keyframe_interval_s: float | None = None  # set for a viewer that cannot ask for packets
        self._loss_keyframe_at: float | None = None  # its last keyframe, delivered or asked for under loss
        self.keyframes_for_loss = 0  # keyframes asked of the hub for its loss

    async def negotiate(self, offer: str) -> str:
        check_offer(offer, self.peer.max_remote_candidates, Role.VIEWER)
        transceiver = self.pc.addTransceiver(self.track, direction="sendonly")
        # What aiortc's sender calls on PLI or FIR (it would force a keyframe of an encoder it does not have here).
        setattr(transceiver.sender, "_send_keyframe", self._keyframe_asked)  # noqa: B010 (an instance's method)
        # Lost packets resent from the sender's own history and asked for again; keyframes under loss for a
        # viewer that cannot ask for packets come from the shared encode (`deliver`).
        self.recovery = recover_sender(
            transceiver.sender, self.hub.return_recovery, keyframes_under_loss=self._keyframes_under_loss
        )
        # The shared encodes are H.264 and Opus; set before the offer is applied, so they count.
        transceiver.setCodecPreferences(codec_preferences(["H264"]))
        if "\nm=audio " in offer:
            self.audio = EncodedAudioTrack()
            audio = self.pc.addTransceiver(self.audio, direction="sendonly")
            audio.setCodecPreferences(codec_preferences(["opus"], "audio"))
        answer = await answer_offer(self.pc, self.ice, offer, self.peer, ["H264"])
        if len(self.pc.getTransceivers()) != (1 if self.audio is None else 2):
            raise OfferError("the offer must have one video section and at most one audio, receive only")
        if "H264/90000" not in answer:
            raise OfferError("viewers must accept H.264")

        @self.pc.on("connectionstatechange")
        async def on_state() -> None:
            if self.pc.connectionState in ("failed", "closed"):
                self.request_close()

        loop = asyncio.get_running_loop()
        loop.call_later(self.peer.ice_timeout_s, self._ice_deadline)
        loop.call_later(CONNECT_TIMEOUT_S, self._connect_deadline)
        return answer

    def _keyframe_asked(self) -> None:
        now = time.monotonic()
        if self._last_asked is None or now - self._last_asked >= self.hub.keyframe_min_interval_s:
            self._last_asked = now
            self.keyframes_asked += 1
            self.hub.request_keyframe()

    def _keyframes_under_loss(self, interval_s: float | None) -> None:
        self._loss_keyframe_interval_s = interval_s

    def deliver(self, packet: av.Packet, keyframe: bool, handed_at: float | None = None) -> None:
        """On the event loop: the shared encode's next frame (handed over by the output at `handed_at`); for a
        viewer that cannot ask for lost packets and reports loss, a keyframe asked for once
        `LOSS_KEYFRAME_INTERVAL_S` passed without one."""
        now = time.monotonic()
        if keyframe:
            self._loss_keyframe_at = now
        elif self._loss_keyframe_due(now):
            self._loss_keyframe_at = now
            self.keyframes_for_loss += 1
            self.hub.request_keyframe()
        self.track.deliver(packet, keyframe, handed_at)

    def _loss_keyframe_due(self, now: float) -> bool:
        interval = self._loss_keyframe_interval_s
        lossy = self.recovery.loss_at if self.recovery is not None else None
        if interval is None or lossy is None or now - lossy > LOSS_KEYFRAME_WHILE_S:
            return False
        return self._loss_keyframe_at is None or now - self._loss_keyframe_at >= interval

    def _ice_deadline(self) -> None:
        if not ice_up(self.pc):
            log.info("viewer %s: ICE did not complete within %.1f s", self.id, self.peer.ice_timeout_s)
            self.request_close()

    def _connect_deadline(self) -> None:
        if self.pc.connectionState != "connected":
            self.request_close()

    def request_close(self) -> asyncio.Task[None]:
        if self._closing is None:
            self._closing = asyncio.get_running_loop().create_task(self._close())
        return self._closing

    async def _close(self) -> None:
        self.hub.remove(self)
        self.track.stop()
        if self.audio is not None:
            self.audio.stop()
        try:
            await asyncio.wait_for(self.pc.close(), PC_CLOSE_TIMEOUT_S)
        except Exception:  # closing must always finish; the error is only logged
            log.exception("viewer %s: peer connection did not close cleanly", self.id)

    def stats(self) -> dict[str, object]:
        return {
            "id": self.id,
            "connection": self.pc.connectionState,
            "frames_sent": self.track.packets_sent,
            "frames_dropped": self.track.packets_dropped,
            "audio_packets_sent": self.audio.packets_sent if self.audio is not None else None,
            "keyframes_asked": self.keyframes_asked,
            "return_recovery": (
                self.recovery.counts.as_dict() | {"keyframes_for_loss": self.keyframes_for_loss}
                if self.recovery is not None
                else None
            ),
        }


class ViewerHub:
    """The viewers of one output and the one encode they share: the hub's own (`offer` is thread-safe and cheap)
    or, given `encode`, that shared encode's packets (the hub is then one of its readers, `packet`).
    `frames_sent` counts the video frames handed to the viewers, `frames_encoded` those the hub's own thread
    encoded (none for a hub that reads a shared encode, which counts what it encodes itself)."""

    audio_codec: str | None = None  # as a reader of a shared encode: its video only (the sound is Opus, below)

    def __init__(
        self,
        name: str,
        loop: asyncio.AbstractEventLoop,
        peer: PeerConfig | None = None,
        encoder: EncoderPolicy | None = None,
        encode: SharedEncode | None = None,
    ) -> None:
        self.name = name
        self._encoder = encoder or EncoderPolicy(EncoderSettings())
        self.frames_encoded = 0
        self.frames_sent = 0
        self.errors = 0
        self._encode = encode
        self._attached = False  # to `encode`: while the hub has viewers (on the event loop)
        self._pts_offset = 0  # 1/90000: keeps the viewers' clock going forward when `encode`'s starts again
        self._last_pts: int | None = None
        self._loop = loop
        self._peer = peer or PeerConfig()
        self._viewers: dict[str, Viewer] = {}
        self.audio = SharedOpusEncoder()  # fed on the event loop by the output's audio (`offer_audio`)
        self._audio_delay = PictureDelay(loop, self.audio.offer)  # as late as the picture reaches the viewers
        self._cond = threading.Condition()
        # The newest frame, not yet encoded, with the instant it was offered.
        self._frames: Mailbox[tuple[OutputFrame, float]] = Mailbox(cond=self._cond)
        self._keyframe = True
        self._watching = False
        self._closed = False
        self._thread: threading.Thread | None = None
        if encode is None:
            self._thread = threading.Thread(target=self._encode_loop, name=f"whep-{name}", daemon=True)
            self._thread.start()

    @property
    def dropped(self) -> int:
        return self._frames.dropped

    @property
    def keyframe_min_interval_s(self) -> float:
        """How often a viewer's keyframe requests are passed on (`SWAPCAST_ENCODER_KEYFRAME_MIN_INTERVAL_S`)."""
        return self._encoder.settings.keyframe_min_interval_s

    @property
    def return_recovery(self) -> bool:
        """Whether viewers' senders recover their losses (`SWAPCAST_ENCODER_RETURN_RECOVERY`)."""
        return self._encoder.settings.return_recovery

    def viewers(self) -> list[Viewer]:
        return list(self._viewers.values())

    def get(self, viewer_id: str) -> Viewer | None:
        return self._viewers.get(viewer_id)

    def offer(self, image: OutputFrame) -> None:
        """The newest output frame; dropped at once while nobody watches."""
        if self._watching:
            self._frames.put((image, time.monotonic()))

    def offer_audio(self, frame: av.AudioFrame, due: float | None = None) -> None:
        """On the event loop: the output's audio, due to play now; encoded once for every viewer that takes it, as
        late as the picture currently reaches them. (`due` is not needed: viewers' audio and video are timed by
        their own senders as they go out.)"""
        self._audio_delay.offer(frame)

    def picture_took(self, seconds: float) -> None:
        """On the event loop: a frame left for a viewer's sender `seconds` after the output handed it over."""
        self._audio_delay.picture_took(seconds)

    @property
    def picture_delay_ms(self) -> float:
        """How long a frame currently takes from the output to the viewers (what their sound is held back by)."""
        return round(self._audio_delay.delay_s * 1000, 1)

    def request_keyframe(self) -> None:
        if self._encode is not None:
            self._encode.keyframe()  # throttled there: one keyframe serves every reader
            return
        with self._cond:
            self._keyframe = True

    async def add_viewer(self, offer: str) -> tuple[Viewer, str]:
        """Negotiate a new viewer; returns it with the SDP answer."""
        if self._closed:
            raise OfferError(f"{self.name} has ended")
        viewer = Viewer(self, self._peer)
        try:
            answer = await viewer.negotiate(offer)
        except BaseException:
            await viewer.request_close()
            raise
        if self._closed:  # the output ended while this viewer was negotiated: nothing would ever end it
            await viewer.request_close()
            raise OfferError(f"{self.name} has ended")
        self._viewers[viewer.id] = viewer
        if viewer.audio is not None:
            self.audio.tracks.append(viewer.audio)
        if self._encode is None:
            with self._cond:
                self._watching = True
                self._keyframe = True
        elif not self._attached:
            self._attached = True
            self._encode.attach(self)  # which asks for a keyframe
        else:
            self._encode.keyframe()
        return viewer, answer

    def remove(self, viewer: Viewer) -> None:
        self._viewers.pop(viewer.id, None)
        if viewer.audio in self.audio.tracks:
            self.audio.tracks.remove(viewer.audio)
        if not self._viewers:
            self._detach()
            with self._cond:
                self._watching = False
                self._frames.discard()

    async def close(self) -> None:
        """End every viewer and the encoder thread (or the reading of the shared encode)."""
        with self._cond:
            self._closed = True
            self._watching = False
            self._frames.discard()
            self._cond.notify_all()
        self._detach()
        self._audio_delay.close()
        await asyncio.gather(*(v.request_close() for v in list(self._viewers.values())), return_exceptions=True)
        if self._thread is not None:
            await asyncio.get_running_loop().run_in_executor(None, self._thread.join, 5.0)

    # Reading a shared encode.
    def _detach(self) -> None:
        if self._encode is not None and self._attached:
            self._attached = False
            self._encode.detach(self)

    def packet(self, packet: EncodedPacket) -> None:
        """On the shared encode's thread, never blocking: its next video packet, to every viewer on the event
        loop as the hub's own encoder would hand it."""
        if not packet.video:
            return
        out = av.Packet(packet.data)
        pts = packet.pts_us * VIDEO_TIME_BASE.denominator // MICROSECONDS + self._pts_offset
        if self._last_pts is not None and pts <= self._last_pts:  # the encode started again from 0 (a failure)
            self._pts_offset += self._last_pts + 1 - pts
            pts = self._last_pts + 1
        self._last_pts = pts
        out.pts = out.dts = pts
        out.time_base = VIDEO_TIME_BASE
        self.frames_sent += 1
        handed_at = packet.handed_at if packet.handed_at is not None else time.monotonic()
        with contextlib.suppress(RuntimeError):  # the loop has closed (the server stops): nobody to hand it to
            self._loop.call_soon_threadsafe(self._deliver, out, packet.keyframe, handed_at)

    # Encoder thread.
    def _next(self) -> tuple[OutputFrame, float, bool] | None:
        with self._cond:
            while not self._closed:
                item = self._frames.take()
                if item is not None:
                    keyframe, self._keyframe = self._keyframe, False
                    return item[0], item[1], keyframe
                self._cond.wait()
            return None

    def _encode_loop(self) -> None:
        codec: VideoCodecContext | None = None
        size = (0, 0)
        started = time.monotonic()
        last_keyframe = 0.0
        while (item := self._next()) is not None:
            output, offered_at, keyframe = item
            try:
                width, height = output.size
                even = (width - width % 2, height - height % 2)
                if codec is None or size != even:
                    codec, size = self._encoder.open_shared(*even, VIDEO_TIME_BASE), even
                    keyframe = True
                frame = to_frame(output if output.even else output.image[: size[1], : size[0]])
                now = time.monotonic()
                keyframe = keyframe or now - last_keyframe >= self._encoder.keyframe_interval_s
                frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
                frame.pts = int((now - started) / VIDEO_TIME_BASE)
                frame.time_base = VIDEO_TIME_BASE
                for packet in codec.encode(frame):
                    packet.time_base = VIDEO_TIME_BASE
                    key = bool(packet.is_keyframe)
                    if key:
                        last_keyframe = now
                    self.frames_encoded += 1
                    self.frames_sent += 1
                    self._loop.call_soon_threadsafe(self._deliver, packet, key, offered_at)
            except Exception:
                self.errors += 1
                if self.errors == 1:
                    log.exception("viewers of %s: encoding failed (counted from now on)", self.name)
                codec = None

    def _deliver(self, packet: av.Packet, keyframe: bool, handed_at: float) -> None:
        for viewer in list(self._viewers.values()):
            viewer.deliver(packet, keyframe, handed_at)
