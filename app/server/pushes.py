"""The channels' pushes while the server runs: each stored push (`app.channels.pushes`) as a `Push` fed by its
channel's one `PushEncode`, which listens to the channel's feed while the channel has pushes; started with the
channel and stopped with it. Every method here blocks (the store's file, a push's thread ending): run them off
the event loop."""

from __future__ import annotations

import contextlib
import logging
import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from app.channels.pushes import PushRecord, PushStore
from app.media.encoder import EncoderPolicy
from app.media.push import Push
from app.media.push_destination import Destination
from app.media.push_encode import PushEncode
from app.media.push_sinks import srt_unavailable_reason
from app.server.resource_errors import Conflict, NotFound, Unavailable

if TYPE_CHECKING:
    from app.server.channels import Channel

log = logging.getLogger(__name__)


class PushNotFound(NotFound):
    what = "push"


@dataclass(frozen=True)
class PushOptions:
    enabled: bool  # run the pushes in this process
    max_per_channel: int
    backoff_s: float
    backoff_max_s: float


class PushManager:
    def __init__(self, store: PushStore, policy: EncoderPolicy, options: PushOptions) -> None:
        self.store = store
        self._policy = policy
        self._options = options
        self._lock = threading.Lock()
        # Each running channel's encode for its pushes, while it has some (by the channel: a channel deleted
        # and made again under its name has a new feed).
        self._encodes: weakref.WeakKeyDictionary[Channel, PushEncode] = weakref.WeakKeyDictionary()

    def start_channel(self, channel: Channel) -> None:
        """The channel's stored pushes start sending (when pushes run in this process)."""
        for record in self.store.records(channel.id):
            self._start(channel, record)

    def stop_channel(self, channel: Channel) -> None:
        """The channel's pushes stop (their records stay)."""
        for push_id in list(channel.pushes):
            self._stop(channel, push_id)

    def forget_channel(self, name: str) -> None:
        """The deleted channel's pushes are deleted too."""
        self.store.remove_channel(name)

    def add(self, channel: Channel, owner: str, destination: Destination) -> dict[str, Any]:
        """A new push of the channel, started at once; its description."""
        if destination.kind == "srt":
            reason = srt_unavailable_reason()
            if reason is not None:
                raise Unavailable(reason)  # SRT cannot run here; the reason says what to install
        with self._lock:
            if len(self.store.records(channel.id)) >= self._options.max_per_channel:
                raise Conflict(f"the channel has {self._options.max_per_channel} pushes, the most it may have")
            record = self.store.add(channel.id, owner, destination)
        self._start(channel, record)
        log.info("channel %s: push %s to %s added", channel.id, record.id, destination.shown)
        return self.describe(channel, record)

    def remove(self, channel: Channel, push_id: str) -> None:
        record = self._record(channel, push_id)
        self.store.remove(record.id)
        self._stop(channel, record.id)
        log.info("channel %s: push %s removed", channel.id, record.id)

    def get(self, channel: Channel, push_id: str) -> dict[str, Any]:
        return self.describe(channel, self._record(channel, push_id))

    def list(self, channel: Channel) -> list[dict[str, Any]]:
        return [self.describe(channel, record) for record in self.store.records(channel.id)]

    def describe(self, channel: Channel, record: PushRecord) -> dict[str, Any]:
        """The push as the API shows it: its destination with the secrets hidden, and how it is doing here."""
        push = channel.pushes.get(record.id)
        stats = push.stats() if push is not None else {"state": "off"}
        return {**record.public(), **stats}

    def _record(self, channel: Channel, push_id: str) -> PushRecord:
        record = next((r for r in self.store.records(channel.id) if r.id == push_id), None)
        if record is None:
            raise PushNotFound(push_id)
        return record

    def _start(self, channel: Channel, record: PushRecord) -> None:
        if not self._options.enabled or record.id in channel.pushes:
            return
        push = Push(
            record.id,
            record.destination,
            self._encode(channel),
            backoff_s=self._options.backoff_s,
            backoff_max_s=self._options.backoff_max_s,
        )
        channel.pushes[record.id] = push
        push.start()

    def _encode(self, channel: Channel) -> PushEncode:
        """The channel's encode for its pushes, listening to its feed from its first push on."""
        with self._lock:
            encode = self._encodes.get(channel)
            if encode is None:
                feed = channel.feed
                encode = PushEncode(feed.width, feed.height, feed.fps, self._policy, channel.id)
                self._encodes[channel] = encode
                feed.output_listeners.append(encode.frame)
                feed.audio_listeners.append(encode.audio)
                feed.keyframe_listeners.append(encode.keyframe)
            return encode

    def _stop(self, channel: Channel, push_id: str) -> None:
        push = channel.pushes.pop(push_id, None)
        if push is None:
            return
        push.close()
        with self._lock:
            encode = self._encodes.get(channel) if not channel.pushes else None
            if encode is None:
                return
            del self._encodes[channel]
        feed = channel.feed
        for listeners, listener in (
            (feed.output_listeners, encode.frame),
            (feed.audio_listeners, encode.audio),
            (feed.keyframe_listeners, encode.keyframe),
        ):
            with contextlib.suppress(ValueError):
                listeners.remove(listener)  # type: ignore[arg-type]
