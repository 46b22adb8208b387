"""A channel's one encode for all its SRT callers: MPEG-TS with H.264 (the server's `EncoderPolicy`) and AAC,
written chunk by chunk into the channel's `Fanout`.

It is a `Push` (`app.media.push`: the newest frame at the channel's rate, the sound laid to match, keyframes on
request) whose connection is a muxer writing into memory rather than a destination; it runs only while the
channel has callers. It encodes in this process, unlike a push, whose FFmpeg network muxer holds Python's lock
while it waits on the network: here the muxer writes to memory and libsrt's non-blocking sends go through
ctypes, which lets the lock go.
"""

from __future__ import annotations

import fractions
from collections.abc import Callable
from typing import Any, Protocol

import av
import numpy as np

from app.live.adapter import AudioListener
from app.live.core import OutputListener
from app.media.encoder import EncoderPolicy
from app.media.push import Push
from app.media.push_destination import Destination
from app.media.push_sinks import AUDIO_RATE, TS_CHUNK, MuxSink
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


class _MemoryConnection:
    """`Push`'s connection: the encoder and MPEG-TS muxer, writing into the fan-out."""

    def __init__(self, gate: _Gate, width: int, height: int, fps: int, policy: EncoderPolicy) -> None:
        self._fanout = gate.fanout
        self._height, self._width, self._fps = height, width, fps
        self._mux = MuxSink(gate, "mpegts", width, height, fps, policy, "aac", buffer_size=TS_CHUNK)
        self.audio_frame_samples = self._mux.audio_frame_samples

    def connected(self) -> bool:
        return self._fanout.count() > 0

    def sent(self) -> int:
        return self._fanout.sent()

    def send_video(self, i420: np.ndarray[Any, np.dtype[np.uint8]], pts: int, keyframe: bool) -> None:
        frame = av.VideoFrame.from_numpy_buffer(i420.reshape(self._height * 3 // 2, self._width), format="yuv420p")
        frame.pts, frame.time_base = pts, fractions.Fraction(1, self._fps)
        frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
        self._mux.send_video(frame)

    def send_audio(self, planar: np.ndarray[Any, np.dtype[np.float32]], pts: int) -> None:
        audio = av.AudioFrame.from_ndarray(np.ascontiguousarray(planar), format="fltp", layout="stereo")
        audio.sample_rate = AUDIO_RATE
        audio.pts, audio.time_base = pts, fractions.Fraction(1, AUDIO_RATE)
        self._mux.send_audio(audio)

    def close(self) -> None:
        self._mux.close()


class ChannelEncode:
    """Started with the channel's first caller, stopped after its last; `keyframe` for each new caller."""

    def __init__(self, name: str, feed: Feed, fanout: Fanout, policy: EncoderPolicy, port: int) -> None:
        self._feed = feed
        self._gate = gate = _Gate(fanout)
        fps = feed.fps

        def connection(_d: Destination, width: int, height: int, _fps: int, policy: EncoderPolicy) -> Any:
            return _MemoryConnection(gate, width, height, fps, policy)

        shown = Destination(kind="srt", url=f"srt://:{port}?streamid={name}", mode="listener")
        self.push = Push(f"srt-{name}", shown, feed.width, feed.height, fps, policy, opener=connection)

    def start(self) -> None:
        self._feed.output_listeners.append(self.push.frame)
        self._feed.audio_listeners.append(self.push.audio)
        self._feed.keyframe_listeners.append(self.push.keyframe)
        self.push.start()

    def keyframe(self) -> None:
        self.push.keyframe()

    def stop(self) -> None:
        """Leave the feed and stop (blocking while the encoder's thread ends)."""
        self._gate.open = False
        for listeners, listener in (
            (self._feed.output_listeners, self.push.frame),
            (self._feed.audio_listeners, self.push.audio),
            (self._feed.keyframe_listeners, self.push.keyframe),
        ):
            if listener in listeners:
                listeners.remove(listener)  # type: ignore[arg-type]
        self.push.close()
