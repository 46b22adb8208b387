"""WebRTC sessions: a client sends its camera over WebRTC and gets the swapped video back on the same connection.

Per session a receive task reads decoded frames as fast as they arrive and keeps only the newest (aiortc's
receiver queue is unbounded, so reading slower than frames arrive builds latency without limit); one worker
runs the pipeline on the newest frame in an executor; the output track hands the newest processed frame to
the encoder with the input frame's timestamp. Every frame replaced before it was used is counted as a drop
with its reason. Switching identity replaces the prepared source the worker reads for its next frame, so it
never waits behind video. A session ends, and everything it holds is released, on every terminal event:
connection failed or closed, the client's track ended, no media for too long, DELETE, or shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import av
import numpy as np
from aiortc import RTCConfiguration, RTCIceServer, RTCPeerConnection
from aiortc.mediastreams import MediaStreamError, MediaStreamTrack

from app.live.adapter import AudioListener, LiveOutput
from app.live.core import LiveCore
from app.live.counters import LiveCounters
from app.live.frame import OutputFrame
from app.live.lazy_path import LazyPath, OpenPath, PathPublisher
from app.media import yuv
from app.media.audio_sync import MAX_DELAY_S, DelayedAudioTrack
from app.media.encoder import encoder_settings
from app.media.ice_bounds import BoundedIce
from app.media.mailbox import Mailbox
from app.media.peer import (
    PeerConfig,
    answer_offer,
    check_offer,
    codec_preferences,
    negotiated_codec,
)
from app.media.recovery import ReceiverGuard, guard_receiver
from app.media.sender_feedback import SenderTap, tap_sender
from app.media.sender_recovery import SenderRecovery, recover_sender
from app.observability import Metrics
from app.pipeline.identity_map import FaceSources
from app.pipeline.pipeline import FramePipeline
from app.pipeline.timing import StageTimer
from app.runtime.batcher import BatcherError

if TYPE_CHECKING:  # the egress reads the ingress's frames, never the reverse
    from app.egress.encode import SharedEncode

log = logging.getLogger(__name__)

KIND = "session"
PC_CLOSE_TIMEOUT_S = 5.0


class PublisherFactory(Protocol):
    """Publishes an RTSP path (the server's `RtspOutput.publish`); with `audio` it carries the microphone too."""

    def __call__(self, path: str, width: int, height: int, *, audio: bool) -> PathPublisher: ...


WATCHDOG_PERIOD_S = 0.25
# Input that resumes after a gap this long (an outage, a stall) gets a keyframe back: what the client received
# from us just before the gap may be lost, and a browser would wait for the next scheduled one.
RESUME_GAP_S = 1.0


@dataclass(frozen=True)
class SessionConfig:
    max_sessions: int = 4
    codecs: tuple[str, ...] = ("H264", "VP8")
    connect_timeout_s: float = 20.0
    media_timeout_s: float = 10.0
    # ICE servers, offer and candidate bounds, the advertised address, and the ICE timeout: a client that does
    # not complete ICE within it is not coming, and its slot frees long before the connect timeout (four canned
    # offers with no peer behind them held every slot for 20 s).
    peer: PeerConfig = field(default_factory=PeerConfig)


class SwappedVideoTrack(MediaStreamTrack):
    """Output track: hands the encoder the newest processed frame; an older one still waiting is dropped."""

    kind = "video"

    def __init__(self, on_sent: Callable[[float, float], None], on_dropped: Callable[[], None]) -> None:
        super().__init__()
        self._on_sent = on_sent
        self._frames: Mailbox[tuple[av.VideoFrame, float, float]] = Mailbox(
            on_drop=lambda _reason, _count: on_dropped(), wakes_loop=True
        )

    def put(self, frame: av.VideoFrame, arrived: float, processed: float) -> None:
        self._frames.put((frame, arrived, processed))

    async def recv(self) -> av.VideoFrame:
        while True:
            if self.readyState != "live":
                raise MediaStreamError
            item = self._frames.take()
            if item is not None:
                frame, arrived, processed = item
                self._on_sent(arrived, processed)
                return frame
            await self._frames.wait_async()

    def stop(self) -> None:
        super().stop()
        self._frames.discard()
        self._frames.wake()


class Session(LiveOutput):
    def __init__(
        self,
        *,
        identity_id: str,
        source: FaceSources,
        pipeline: FramePipeline,
        executor: Executor,
        metrics: Metrics,
        config: SessionConfig,
        on_closed: Callable[[Session], None],
        publisher_factory: PublisherFactory | None = None,
        rtsp_url: Callable[[str], str] | None = None,
    ) -> None:
        self.id = secrets.token_hex(16)
        # Everything between decoded frame in and processed frame out (app.live): this class is the transport.
        self.core = LiveCore(
            kind=KIND, name=self.id, identity_id=identity_id, source=source, pipeline=pipeline, metrics=metrics
        )
        self._return_encoded = metrics.egress_frames_encoded.labels("return")  # this session's own encoder
        self.return_frames_encoded = 0
        self.created = datetime.now(UTC).isoformat(timespec="seconds")
        self.state = "new"
        self.codec: str | None = None
        self.close_reason: str | None = None
        self.closed = self.ended = asyncio.Event()
        self._executor = executor
        self._config = config
        self._on_closed = on_closed
        self.rtsp_path = f"/session/{self.id}"
        self._rtsp = LazyPath(self._path_opener(publisher_factory), f"session {self.id}")
        self.rtsp_url = rtsp_url(self.rtsp_path) if (rtsp_url and publisher_factory) else None
        self.channel: str | None = None  # the channel it publishes into, if any
        # The newest decoded frame not yet taken: put by the receive task, taken by an executor thread.
        self._pending: Mailbox[tuple[av.VideoFrame, float]] = Mailbox(
            on_drop=lambda reason, _count: self.core.drop(reason), wakes_loop=True
        )
        self._tasks: set[asyncio.Task[None]] = set()
        self._close_task: asyncio.Task[None] | None = None
        self._video_track: MediaStreamTrack | None = None
        self._started = time.monotonic()
        self._connected_at: float | None = None
        self._last_input = self._started
        self._last_frame_at: float | None = None
        self._sender: Any = None
        self._recovery: ReceiverGuard | None = None
        self._sender_tap: SenderTap | None = None
        self._sender_recovery: SenderRecovery | None = None
        self.resumed = 0  # times the input resumed after RESUME_GAP_S or more
        self._error_logged = 0
        ice = [RTCIceServer(url) for url in config.peer.ice_servers]
        self.pc = RTCPeerConnection(RTCConfiguration(iceServers=ice))
        self.ice = BoundedIce(config.peer.ice_bounds)
        self.output = SwappedVideoTrack(self._on_sent, lambda: self.core.drop("output_superseded"))
        # The client's microphone, sent back delayed by the video's processing latency plus this offset.
        self.audio = DelayedAudioTrack(self._audio_delay_s)
        self.audio_offset_ms = 0

    @property
    def counters(self) -> LiveCounters:
        return self.core.counters

    @property
    def audio_listeners(self) -> list[AudioListener]:
        return self.audio.outputs

    # --------------------------------------------------------------------------------- signalling

    async def negotiate(self, offer: str) -> str:
        """Apply the client's offer and return the answer (ICE gathering complete: no trickle)."""
        check_offer(offer, self._config.peer.max_remote_candidates)
        transceiver = self.pc.addTransceiver(self.output, direction="sendrecv")
        transceiver.setCodecPreferences(codec_preferences(self._config.codecs))
        self._sender = transceiver.sender
        self._sender_tap = tap = tap_sender(transceiver.sender)  # the client's loss reports reach the encoder's rate
        # Every lost packet resent, and asked for again if lost again (app.media.sender_recovery).
        self._sender_recovery = recover_sender(
            transceiver.sender, encoder_settings().return_recovery, tap.resent if tap is not None else None
        )
        if tap is not None and self._sender_recovery is not None and self._sender_recovery.enabled:
            tap.count_nacks = False
        self._recovery = guard_receiver(transceiver.receiver)  # a time limit on holes (app.media.recovery)
        if "\nm=audio " in offer:
            self.pc.addTransceiver(self.audio, direction="sendrecv")
        self.pc.on("track", self._on_track)
        self.pc.on("connectionstatechange", self._on_connection_state)
        local = await answer_offer(self.pc, self.ice, offer, self._config.peer, self._config.codecs)
        self.codec = negotiated_codec(local)
        self.state = "connecting"
        self._spawn(self._watchdog(), "watchdog")
        self._spawn(self._work(), "worker")
        return local

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "video" and self._video_track is None:
            self._video_track = track
            self._spawn(self._receive(track), "receive")
        elif track.kind == "audio":
            self.audio.receiving = True
            self._spawn(self._receive_audio(track), "audio")
        else:
            self._spawn(self._drain(track), "drain")

    async def _on_connection_state(self) -> None:
        state = self.pc.connectionState
        if state == "connected":
            now = time.monotonic()
            self._connected_at = now
            self._last_input = now
            if self.state == "connecting":
                self.state = "connected"
        elif state in ("failed", "closed"):
            self.request_close(f"connection {state}")

    # --------------------------------------------------------------------------------- media

    async def _receive(self, track: MediaStreamTrack) -> None:
        """Read every decoded frame as soon as it exists; keep only the newest for the worker."""
        while True:
            try:
                frame = await track.recv()
            except MediaStreamError:
                break
            if not isinstance(frame, av.VideoFrame):
                continue
            now = time.monotonic()
            if self._last_frame_at is not None and now - self._last_frame_at >= RESUME_GAP_S:
                self._resume()
            self._last_input = self._last_frame_at = now
            self.core.frame_in(now)
            self._pending.put((frame, now))
        self.request_close("track ended")

    def _resume(self) -> None:
        """The input came back after a gap: the next frame returned is a keyframe."""
        self.resumed += 1
        send_keyframe = getattr(self._sender, "_send_keyframe", None)  # what aiortc's sender does on PLI
        if send_keyframe is not None:
            send_keyframe()

    async def _receive_audio(self, track: MediaStreamTrack) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                if isinstance(frame, av.AudioFrame):
                    self.audio.push(frame, time.monotonic())

    def _audio_delay_s(self) -> float:
        """The video's processing latency (median of its last 30 frames) plus the user's offset, as applied:
        audio cannot leave before it arrived nor be held past MAX_DELAY_S."""
        recent = list(self.counters.latencies)[-30:]
        video = float(np.median(recent)) if recent else 0.0
        return min(MAX_DELAY_S, max(0.0, video + self.audio_offset_ms / 1000.0))

    def set_audio(self, enabled: bool | None = None, offset_ms: int | None = None) -> None:
        if enabled is not None:
            self.audio.enabled = enabled
            if not enabled:
                self.audio.clear()
        if offset_ms is not None:
            self.audio_offset_ms = offset_ms

    def audio_stats(self) -> dict[str, Any]:
        a = self.audio
        return {
            "enabled": a.enabled,
            "offset_ms": self.audio_offset_ms,
            "delay_ms": round(self._audio_delay_s() * 1000.0, 1),
            "frames_in": a.frames_in,
            "frames_out": a.frames_out,
            "dropped": a.dropped,
        }

    async def _drain(self, track: MediaStreamTrack) -> None:
        """Tracks this server does not use (audio) are read and discarded so their queues stay empty."""
        with contextlib.suppress(MediaStreamError):
            while True:
                await track.recv()

    async def _work(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._pending.wait_async()
            if not self._pending.has_item:
                continue
            timer = StageTimer()
            try:
                done = await loop.run_in_executor(self._executor, self._process_newest, timer)
            except BatcherError as exc:  # stale under load (deadline, queue full): dropped, not an error
                self.core.drop("stale")
                log.debug("session %s: frame dropped by the batcher: %s", self.id, exc)
                continue
            except Exception:  # one bad frame must not end the session; the drop is counted and logged
                self.core.drop("error")
                self._error_logged += 1
                if self._error_logged == 1 or self._error_logged % 100 == 0:
                    log.exception("session %s: frame processing failed (%d so far)", self.id, self._error_logged)
                continue
            if done is None:
                continue
            out, image, arrived, processed = done
            self.output.put(out, arrived, processed)
            self.core.finished(image, timer)
            await self._publish(image)

    def _process_newest(self, timer: StageTimer) -> tuple[av.VideoFrame, OutputFrame, float, float] | None:
        """Runs in the executor. The frame is taken only when a thread is free for it, so a session that waited
        for a thread behind other sessions still processes its newest frame; likewise the identity."""
        pending = self._pending.take()
        if pending is None:
            return None
        frame, arrived = pending
        self.core.hops.observe("queue", time.monotonic() - arrived)
        out, image = self._process(frame, timer)
        out.opaque = self._encode_callback(arrived)
        return out, image, arrived, time.monotonic()

    def _encode_callback(self, arrived: float) -> Callable[[float, float], None]:
        """Called by the encoder's thread (app.media.hops.TimedEncoder) once this frame is encoded."""

        hops = self.core.hops

        def encoded(started: float, ended: float) -> None:
            hops.observe("encode", ended - started)
            hops.observe("total", ended - arrived)
            self.return_frames_encoded += 1
            self._return_encoded.inc()

        return encoded

    def _process(self, frame: av.VideoFrame, timer: StageTimer) -> tuple[av.VideoFrame, OutputFrame]:
        """Convert, process in the core, convert back, keeping the input's timestamp. The I420 form made for the
        return goes with the frame to the other outputs (WHEP, RTSP, a channel), which need not convert again."""
        with timer.stage("convert_in"):
            image = np.asarray(frame.to_ndarray(format="bgr24"), np.uint8)
        result = OutputFrame(self.core.process(image, timer))
        with timer.stage("convert_out"):
            out = yuv.to_frame(result)
            out.pts = frame.pts
            out.time_base = frame.time_base
        return out, result

    def _path_opener(self, publish: PublisherFactory | None) -> OpenPath | None:
        if publish is None:
            return None
        return lambda width, height, audio: publish(self.rtsp_path, width, height, audio=audio)

    async def _publish(self, image: OutputFrame) -> None:
        """The session's own RTSP path, published at the first frame's size (off the loop: it builds a pipeline)
        with the microphone too when one comes in."""
        path = self._rtsp
        if path.given_up:
            return
        if not path.published:
            audio = self.audio.receiving
            if not await asyncio.get_running_loop().run_in_executor(None, path.open, *image.size, audio):
                self.rtsp_url = None
                return
            if audio:
                self.audio.outputs.append(path.push_audio)
        path.push(image)

    def _on_sent(self, arrived: float, processed: float) -> None:
        now = time.monotonic()
        self.core.hops.observe("output_wait", now - processed)
        self.core.frame_out(arrived, now)

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(WATCHDOG_PERIOD_S)
            now = time.monotonic()
            if self._connected_at is None:
                ice = self.pc.iceConnectionState
                if ice not in ("connected", "completed") and now - self._started > self._config.peer.ice_timeout_s:
                    self.request_close("ICE timeout")
                    return
                if now - self._started > self._config.connect_timeout_s:
                    self.request_close("connect timeout")
                    return
            elif now - self._last_input > self._config.media_timeout_s:
                self.request_close("media timeout")
                return

    # --------------------------------------------------------------------------------- control

    def frees_in(self) -> float | None:
        """Seconds until this session closes for sure: while it connects, its ICE or connect deadline."""
        if self._connected_at is not None:
            return None
        elapsed = time.monotonic() - self._started
        ice = self.pc.iceConnectionState in ("connected", "completed")
        deadline = self._config.connect_timeout_s if ice else self._config.peer.ice_timeout_s
        return max(0.0, deadline - elapsed) + WATCHDOG_PERIOD_S

    def _path_encode(self) -> SharedEncode | None:
        """The session's own RTSP path's encode, once its first frame opened it."""
        return self._rtsp.encode

    def stats(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "connection": self.pc.connectionState,
            "codec": self.codec,
            "created": self.created,
            **self.core.stats(),
            "rtsp_url": self.rtsp_url,
            "channel": self.channel,
            "close_reason": self.close_reason,
            "ice": self.ice.describe(),
            "recovery": self.recovery_stats(),
            "return_rate": self._sender_tap.rate_stats() if self._sender_tap is not None else None,
            "return_recovery": self.return_recovery_stats(),
            # The encodes of this session's frames: its return's own, and its path's shared one (its RTSP clients
            # and WHEP viewers; a channel it publishes into has its own, in the channel's figures).
            "egress": {
                "return_frames_encoded": self.return_frames_encoded,
                "encode": encode.stats() if (encode := self._path_encode()) is not None else None,
            },
        }

    def return_recovery_stats(self) -> dict[str, int] | None:
        """What the return's sender did for the client's losses (app.media.sender_recovery)."""
        if self._sender_recovery is None:
            return None
        encoder = self._sender_tap.encoder() if self._sender_tap is not None else None
        keyframes = {k: getattr(encoder, k, 0) for k in ("keyframes_forced", "keyframes_deferred")}
        return self._sender_recovery.counts.as_dict() | keyframes

    def recovery_stats(self) -> dict[str, int] | None:
        """What the input's recovery did (app.media.recovery), and how often the input resumed after a gap."""
        if self._recovery is None:
            return None
        return self._recovery.counts.as_dict() | {"input_resumed": self.resumed}

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(f"session-{self.id[:8]}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def request_close(self, reason: str) -> asyncio.Task[None]:
        """Start closing (once); the returned task finishes when everything is released."""
        if self._close_task is None:
            self._close_task = asyncio.get_running_loop().create_task(self._close(reason))
            self._close_task.set_name(f"session-{self.id[:8]}-close")
        return self._close_task

    async def close(self, reason: str) -> None:
        await asyncio.shield(self.request_close(reason))

    async def _close(self, reason: str) -> None:
        self.close_reason = reason
        self.state = "closing"
        current = asyncio.current_task()
        tasks = [t for t in self._tasks if t is not current]
        for task in tasks:
            task.cancel()
        self.output.stop()
        self.audio.stop()
        if self._recovery is not None:
            self._recovery.close()
        try:
            await asyncio.gather(*tasks, return_exceptions=True)
            try:
                await asyncio.wait_for(self.pc.close(), PC_CLOSE_TIMEOUT_S)
            except TimeoutError:
                log.warning("session %s: peer connection did not close within %.0f s", self.id, PC_CLOSE_TIMEOUT_S)
            except Exception:  # closing must always finish; the error is only logged
                log.exception("session %s: error while closing the peer connection", self.id)
            self._rtsp.close()
        finally:
            self._pending.discard()
            self.core.close()
            self.state = "closed"
            self.closed.set()
            self._on_closed(self)
