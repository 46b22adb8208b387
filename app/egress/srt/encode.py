"""A channel's SRT callers' stream: MPEG-TS with H.264 and AAC, written chunk by chunk into the channel's `Fanout`.

The picture and sound are the channel's shared encode (`app.egress.encode`: encoded once for every reader, keyframes
on request), of which this is one reader that muxes the packets into memory from the first keyframe on, attached
only while the channel has callers. Muxing happens on the
encode's thread, in this process: unlike a push, whose FFmpeg network muxer holds Python's lock while it waits
on the network, this muxer writes to memory and libsrt's non-blocking sends go through ctypes, which lets the
lock go.
"""

from __future__ import annotations

import threading
from typing import Protocol

from app.egress.encode import EncodedPacket, Reader
from app.egress.push_sinks import TS_CHUNK, MuxSink
from app.egress.srt.fanout import Fanout


class Feed(Protocol):
    """What the SRT output takes from a channel: its shared encode (`app.egress.encode.SharedEncode`)."""

    width: int
    height: int
    fps: int

    def attach(self, reader: Reader) -> None: ...

    def detach(self, reader: Reader) -> None: ...

    def keyframe(self) -> None: ...


class _Gate:
    """The muxer's file: chunks go to the fan-out until the encode is stopped (what its muxer flushes then
    would land in the middle of the next encode's stream)."""

    def __init__(self, fanout: Fanout) -> None:
        self.fanout = fanout
        self.open = True

    def write(self, data: bytes) -> int:
        return self.fanout.write(data) if self.open else len(data)


class ChannelEncode:
    """A reader of the channel's shared encode from its first caller to its last: muxes what it gets into MPEG-TS
    for the fan-out; `keyframe` for each new caller."""

    audio_codec = "aac"  # MPEG-TS carries AAC

    def __init__(self, name: str, feed: Feed, fanout: Fanout) -> None:
        self._encode = feed
        self._gate = _Gate(fanout)
        self._mux = MuxSink(self._gate, "mpegts", feed.width, feed.height, feed.fps, "aac", buffer_size=TS_CHUNK)
        self._lock = threading.Lock()  # the encode's thread muxes while `stop` closes
        self._started = False  # a keyframe went into the muxer: callers never get P-frames before one
        self._closed = False

    def start(self) -> None:
        self._encode.attach(self)

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
        """Stop muxing and leave the encode (which stops with its last reader)."""
        self._gate.open = False
        self._encode.detach(self)
        with self._lock:
            self._closed = True
            self._mux.close()
