"""The server's channels: each stored channel (`app.channels.store`) live as a `Channel` while the server runs,
with its feed (`app.live.channel_feed`), its RTSP path `/live/NAME` under its own login, its SRT stream id (its
name, with that login's password as passphrase) and WHEP viewers through the routes every output kind shares.
Sessions and streams publish into a channel; the newest takes over and the older one is ended."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from app.auth.access import Access
from app.channels.store import ChannelExists, ChannelRecord, ChannelStore
from app.egress.path import OutputPath
from app.egress.push import Push
from app.live.adapter import AudioListener, LiveOutput
from app.live.channel_feed import ChannelFeed
from app.live.core import OutputListener
from app.live.frame import OutputFrame
from app.media.encoder import EncoderPolicy
from app.observability import ChannelFigures, Metrics
from app.pipeline.types import Image
from app.server.pushes import PushManager
from app.server.resource_errors import Conflict, NotFound
from app.server.rtsp import FramePublisher, RtspOutput
from app.server.srt import SrtOutput
from app.settings import EncoderSettings

log = logging.getLogger(__name__)

KIND = "channel"
CHANNEL_NAME_MAX = 63
TAKEN_OVER = "taken over by a newer publisher"
CHANNEL_DELETED = "channel deleted"

Closer = Callable[[str], Awaitable[None]]


def rtsp_path(name: str) -> str:
    return f"/live/{name}"


class ChannelNotFound(NotFound):
    what = "channel"


@dataclass(frozen=True)
class ChannelOptions:
    hold_s: float
    slate_path: Path | None
    max_per_owner: int
    max_channels: int | None = None  # on the server, all owners together


@dataclass
class _Publisher:
    output: LiveOutput
    key: str
    close: Closer
    video: OutputListener
    audio: AudioListener | None


class Channel:
    """One channel while the server runs: what the WHEP routes and the viewers need of an output, its RTSP path
    and who publishes into it."""

    def __init__(self, record: ChannelRecord, path: OutputPath) -> None:
        self.record = record
        self.path = path
        self.feed = path.feed
        # The channel's one encode: its RTSP path, WHEP viewers, SRT callers and pushes read its packets; it runs
        # while one of them does.
        self.encode = path.encode
        self.ended = asyncio.Event()  # set when the channel is deleted or the server stops
        self.rtsp: FramePublisher | None = None
        self.rtsp_url: str | None = None
        self.srt: SrtOutput | None = None  # set while the SRT output serves the channel
        self.srt_url: str | None = None
        self.publisher: _Publisher | None = None
        self.pushes: dict[str, Push] = {}  # running in this process, by id
        # The feed's own lists: what WHEP viewers and the RTSP path register with.
        self.output_listeners: list[OutputListener] = path.feed.output_listeners
        self.audio_listeners: list[AudioListener] = path.feed.audio_listeners
        self.keyframe_listeners: list[Callable[[], None]] = path.feed.keyframe_listeners

    @property
    def id(self) -> str:
        return self.record.name

    @property
    def owner(self) -> str:
        return self.record.owner

    def stats(self, consumers: dict[str, int] | None = None) -> dict[str, Any]:
        return {
            "id": self.id,
            **self.record.public(),
            "rtsp_path": rtsp_path(self.id),
            "whep_url": f"/v1/channels/{self.id}/whep",
            "view_url": f"/view/channel/{self.id}",
            "consumers": consumers or {},
            **self.feed.stats(),
            "egress": {"encode": self.encode.stats()},
        }


class ChannelManager:
    def __init__(
        self,
        store: ChannelStore,
        rtsp: RtspOutput,
        access: Access,
        metrics: Metrics,
        options: ChannelOptions,
        encoder: EncoderPolicy | None = None,
        whep_viewers: Callable[[str], int] = lambda key: 0,
        pushes: PushManager | None = None,
        srt: SrtOutput | None = None,
    ) -> None:
        """`whep_viewers(key)`: how many WHEP viewers the output `key` has now. `pushes`: the channels' pushes
        (none without). `srt`: the SRT output the channels are read on (none without)."""
        self.store = store
        self.pushes = pushes
        self._srt = srt
        self._whep_viewers = whep_viewers
        self._rtsp = rtsp
        self._access = access
        self._metrics = metrics
        self._options = options
        self._encoder = encoder or EncoderPolicy(EncoderSettings())
        self._channels: dict[str, Channel] = {}
        self._slate: Image | None = None
        self._watchers: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Open the store and bring every channel up (blocking: run it off the event loop)."""
        if self._options.slate_path is not None:
            slate = cv2.imread(str(self._options.slate_path), cv2.IMREAD_COLOR)
            if slate is None:
                raise ValueError(f"the channel slate {self._options.slate_path} is not an image OpenCV can read")
            self._slate = np.asarray(slate, np.uint8)
        self.store.open()
        self.sync()

    def sync(self) -> list[Channel]:
        """Bring the live channels in line with the store (another replica may have written it); returns the
        channels deleted there, for `end` and `release`."""
        records = {r.name: r for r in self.store.records()}
        for name, record in records.items():
            channel = self._channels.get(name)
            if channel is None:
                self._activate(record)
            elif channel.record.nonce != record.nonce:  # deleted and made again elsewhere: another channel
                self._replace(channel, record)
            elif (channel.record.generation, channel.record.salt) != (record.generation, record.salt):
                self._renew(channel, record)
        return [self._channels.pop(n) for n in [n for n in self._channels if n not in records]]

    async def stop(self) -> None:
        channels = list(self._channels.values())
        self._channels.clear()
        for channel in channels:
            self._end(channel, "shutdown")
        await asyncio.to_thread(self._release_all, channels)
        await self._wait_for_tasks()

    def _activate(self, record: ChannelRecord) -> Channel:
        feed = ChannelFeed(
            record.name, record.width, record.height, record.fps, hold_s=self._options.hold_s, slate=self._slate
        )
        channel_path = OutputPath(feed, self._encoder, metrics=self._metrics)
        channel = self._channels[record.name] = Channel(record, channel_path)
        encode = channel_path.encode
        self._access.owners.record(channel, record.owner, credential="")
        self._access.viewer_tokens.adopt(record.token)
        if self._rtsp.available:
            path = rtsp_path(channel.id)
            login = self.store.rtsp_login(record)
            try:
                publisher = self._rtsp.publish(
                    path, record.width, record.height, record.fps, audio=True, login=login, encode=channel.encode
                )
            except Exception:  # RTSP is one of the channel's outputs: WHEP goes on without it
                log.exception("channel %s: cannot publish its RTSP path", record.name)
            else:
                channel.rtsp = publisher
                channel.rtsp_url = self._rtsp.url(path, login=login)
                # The picture reaches the path through the channel's encode (and its keyframe requests go there).
                feed.audio_listeners.append(publisher.push_audio)
        if self._srt is not None and self._srt.available:
            channel.srt_url = self._srt.publish(record.name, self._passphrase(record), encode)
            channel.srt = self._srt
        if self.pushes is not None:
            try:
                self.pushes.start_channel(channel)
            except Exception:  # a damaged push store leaves the channel's other outputs working
                log.exception("channel %s: cannot start its pushes", record.name)
        return channel

    def _renew(self, channel: Channel, record: ChannelRecord) -> None:
        """New credentials (rotated here or by another replica): the old RTSP login and viewer token stop working,
        and the clients and viewers that used them are disconnected."""
        self._access.viewer_tokens.revoke(channel.record.token.id)
        channel.record = record
        self._access.viewer_tokens.adopt(record.token)
        if channel.rtsp is not None:
            path = rtsp_path(channel.id)
            login = self.store.rtsp_login(record)
            self._rtsp.change_login(path, login)
            channel.rtsp_url = self._rtsp.url(path, login=login)
        if channel.srt is not None:
            channel.srt_url = channel.srt.change_passphrase(channel.id, self._passphrase(record))

    def _replace(self, channel: Channel, record: ChannelRecord) -> None:
        """Another replica deleted the channel and made one of the same name: none of the old one's credentials
        work, its owner no longer manages it and its publisher is ended."""
        self._renew(channel, record)
        self._access.owners.record(channel, record.owner, credential="")
        publisher = channel.publisher
        if publisher is not None:
            self._detach(channel, publisher)
            self._spawn(publisher.close(CHANNEL_DELETED), f"channel-{channel.id}-replaced")

    def _passphrase(self, record: ChannelRecord) -> str:
        """A channel's SRT passphrase is its RTSP password: one read credential, which rotation moves on."""
        return self.store.rtsp_login(record)[1]

    def _end(self, channel: Channel, reason: str) -> None:
        """On the event loop: the channel's viewers and tokens end, and its publisher with `reason`."""
        channel.ended.set()
        self._access.viewer_tokens.revoke(channel.record.token.id)
        self._access.viewer_tokens.forget_output(channel.record.key)
        publisher = channel.publisher
        if publisher is not None:
            self._detach(channel, publisher)
            self._spawn(publisher.close(reason), f"channel-{channel.id}-end-publisher")

    # ------------------------------------------------------------------------------ channels

    def outputs(self) -> list[Channel]:  # the name every kind of live output answers to
        return list(self._channels.values())

    def get(self, name: str) -> Channel:
        """The live channel; what another replica changed since (created, rotated, deleted, made again) is
        brought in first."""
        channel = self._channels.get(name)
        if (channel.record if channel is not None else None) != self.store.get(name):
            for gone in self.sync():
                self._end(gone, CHANNEL_DELETED)
                self._spawn(asyncio.to_thread(self._release, gone), f"channel-{gone.id}-release")
            channel = self._channels.get(name)
        if channel is None:
            raise ChannelNotFound(name)
        return channel

    def create(self, name: str, owner: str, width: int, height: int, fps: int) -> tuple[Channel, str]:
        """A new channel and its viewer token (blocking: run it off the event loop). `ChannelExists` (409) when
        the name is taken, `Conflict` (409) at the owner's most."""
        if self.store.count_owned(owner) >= self._options.max_per_owner:
            raise Conflict(f"you have {self._options.max_per_owner} channels, the most one owner may have")
        most = self._options.max_channels
        if most is not None and len(self.store.records()) >= most:
            raise Conflict(f"the server has {most} channels, the most it may have")
        try:
            record, token = self.store.create(name, owner, width, height, fps)
        except ChannelExists:
            raise ChannelExists(f"channel name {name} is taken") from None
        return self._activate(record), token

    def rotate(self, name: str) -> tuple[Channel, str]:
        channel = self.get(name)
        record, token = self.store.rotate(name)
        self._renew(channel, record)
        return channel, token

    async def delete(self, name: str) -> None:
        """Delete the channel: its consumers are disconnected, its publisher ended."""
        channel = self.get(name)
        await asyncio.to_thread(self.store.delete, name)
        self._channels.pop(name, None)
        self._end(channel, CHANNEL_DELETED)
        if self.pushes is not None:
            await asyncio.to_thread(self.pushes.forget_channel, name)
        await asyncio.to_thread(self._release, channel)

    def rtsp_paths(self) -> list[str]:
        return [rtsp_path(name) for name, channel in list(self._channels.items()) if channel.rtsp is not None]

    def consumers(self, channel: Channel) -> dict[str, int]:
        """Clients reading the channel now, by transport."""
        rtsp = self._rtsp.client_count([rtsp_path(channel.id)]) if channel.rtsp is not None else 0
        consumers = {"rtsp": rtsp, "whep": self._whep_viewers(channel.record.key)}
        if channel.srt is not None:
            consumers["srt"] = channel.srt.caller_count(channel.id)
        return consumers

    def figures(self) -> list[ChannelFigures]:
        """What the metrics export of each channel."""
        figures = []
        for channel in list(self._channels.values()):
            stats = channel.feed.stats()
            figures.append(
                ChannelFigures(channel.id, stats["seconds_held"], stats["seconds_on_slate"], self.consumers(channel))
            )
        return figures

    # ------------------------------------------------------------------------------ publishing

    def attach(self, channel: Channel, output: LiveOutput, close: Closer) -> None:
        """`output` (a session or a stream) publishes into `channel` from its next frame; the publisher before it
        is ended with `TAKEN_OVER`. `close(reason)` ends `output`; it is detached when `output` ends."""
        key = f"{output.core.kind}/{output.id}"
        feed = channel.feed

        def video(image: OutputFrame) -> None:
            feed.publish(key, image)

        def audio(frame: Any, due: float) -> None:
            feed.publish_audio(key, frame, due)

        older = channel.publisher
        publisher = _Publisher(output, key, close, video, audio if output.audio_listeners is not None else None)
        channel.publisher = publisher
        feed.attach(key)
        output.output_listeners.append(video)
        if publisher.audio is not None and output.audio_listeners is not None:
            output.audio_listeners.append(publisher.audio)
        self._metrics.channel_publisher_changes.labels(channel.id).inc()
        if older is not None:
            self._detach(channel, older)
            self._spawn(older.close(TAKEN_OVER), f"channel-{channel.id}-takeover")
        self._spawn(self._detach_when_ended(channel, publisher), f"channel-{channel.id}-publisher")

    async def _detach_when_ended(self, channel: Channel, publisher: _Publisher) -> None:
        await publisher.output.ended.wait()
        if channel.publisher is publisher:
            self._detach(channel, publisher)

    def _detach(self, channel: Channel, publisher: _Publisher) -> None:
        if channel.publisher is publisher:
            channel.publisher = None
        channel.feed.detach(publisher.key)
        with contextlib.suppress(ValueError):
            publisher.output.output_listeners.remove(publisher.video)
        listeners = publisher.output.audio_listeners
        if publisher.audio is not None and listeners is not None:
            with contextlib.suppress(ValueError):
                listeners.remove(publisher.audio)

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        task.set_name(name)
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)

    async def _wait_for_tasks(self) -> None:
        """Publishers being ended finish; watchers of publishers still running are cancelled."""
        for task in list(self._watchers):
            if task.get_name().endswith("-publisher"):
                task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)

    def _release(self, channel: Channel) -> None:
        """Blocking: the channel's pushes stop (their owner, the push manager, stops them), its RTSP path and SRT
        stream id go (their clients disconnected) and its feed's thread stops."""
        if self.pushes is not None:
            self.pushes.stop_channel(channel)
        if channel.rtsp is not None:
            channel.rtsp.close()
            channel.rtsp = None
        if channel.srt is not None:
            channel.srt.unpublish(channel.id)
            channel.srt = None
        channel.path.close()

    def _release_all(self, channels: list[Channel]) -> None:
        for channel in channels:
            self._release(channel)
