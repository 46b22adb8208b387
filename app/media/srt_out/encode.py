"""A channel's one encode for all its SRT callers: MPEG-TS with H.264 (the server's `EncoderPolicy`) and AAC,
written chunk by chunk into the channel's `Fanout`.

The picture and sound are encoded by a `PushEncode` (`app.media.push_encode`: the newest frame at the channel's
rate, the sound laid to match, keyframes on request), to which this is one subscriber that muxes the packets
into memory from the first keyframe on; it runs only while the channel has callers. Muxing happens on the
encode's thread, in this process: unlike a push, whose FFmpeg network muxer holds Python's lock while it waits
on the network, this muxer writes to memory and libsrt's non-blocking sends go through ctypes, which lets the
lock go.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Protocol

from app.live.adapter import AudioListener
from app.live.core import OutputListener
from app.media.encoder import EncoderPolicy
from app.media.push_encode import EncodedPacket, PushEncode
from app.media.push_sinks import TS_CHUNK, MuxSink
from app.media.srt_out.fanout import Fanout


class Feed(Protocol):
    """What the encode takes from a channel: its picture size and rate, and the listener lists it joins."""

    width: int
    height: int
    fps: int
    output_listeners: list[OutputListener]
    audio_listeners: list[AudioListener]
    keyframe_listeners: list[Callable[[], None]]


class _Gate:
    """The muxer's file: chunks go to the fan-out until the encode is stopped (what its muxer flushes then
    would land in the middle of the next encode's stream)."""

    def __init__(self, fanout: Fanout) -> None:
        self.fanout = fanout
        self.open = True

    def write(self, data: bytes) -> int:
        return self.fanout.write(data) if self.open else len(data)


class ChannelEncode:
    """Started with the channel's first caller, stopped after its last; `keyframe` for each new caller."""

    audio_codec = "aac"  # a `Subscriber` of the push encode: MPEG-TS carries AAC

    def __init__(self, name: str, feed: Feed, fanout: Fanout, policy: EncoderPolicy) -> None:
        self._feed = feed
        self._gate = _Gate(fanout)
        self._encode = PushEncode(feed.width, feed.height, feed.fps, policy, f"srt-{name}")
        self._mux = MuxSink(self._gate, "mpegts", feed.width, feed.height, feed.fps, "aac", buffer_size=TS_CHUNK)
        self._lock = threading.Lock()  # the encode's thread muxes while `stop` closes
        self._started = False  # a keyframe went into the muxer: callers never get P-frames before one
        self._closed = False

    def start(self) -> None:
        encode = self._encode
        self._feed.output_listeners.append(encode.frame)
        self._feed.audio_listeners.append(encode.audio)
        self._feed.keyframe_listeners.append(encode.keyframe)
        encode.attach(self)

    def keyframe(self) -> None:
        self._encode.keyframe()

    def packet(self, packet: EncodedPacket) -> None:
        """One encoded packet, on the encode's thread (memory and non-blocking sends: it never waits)."""
        with self._lock:
            if self._closed:
                return
            if not self._started:
                if not (packet.video and packet.keyframe):
                    return
                self._started = True
            self._mux.send(packet.video, packet.data, packet.pts_us, packet.keyframe)

    def stop(self) -> None:
        """Leave the feed and stop muxing (the encode's thread ends at its next tick, with no subscriber)."""
        self._gate.open = False
        encode = self._encode
        for listeners, listener in (
            (self._feed.output_listeners, encode.frame),
            (self._feed.audio_listeners, encode.audio),
            (self._feed.keyframe_listeners, encode.keyframe),
        ):
            with contextlib.suppress(ValueError):
                listeners.remove(listener)  # type: ignore[arg-type]
        encode.detach(self)
        with self._lock:
            self._closed = True
            self._mux.close()
