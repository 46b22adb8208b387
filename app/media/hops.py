"""Timing the encoder's hop of a live frame (the other hops are recorded by `app.live.hops.HopRecorder`).

Hops of a WebRTC frame, each measured on the server's monotonic clock from the moment aiortc hands over the
decoded frame:

- `queue`: decoded → taken by a pipeline worker (waiting for a thread, or behind the previous frame);
- one hop per pipeline stage (`convert_in`, `detect`, `track`, `align`, `swap`, `paste`, `convert_out`, ...);
- `output_wait`: processed → taken by the encoder (aiortc asks at its own pace);
- `encode`: the video encoder's own run;
- `total`: decoded → encoded, ready for the network.

aiortc does not say when a frame's packets arrived from the network, so the first hop starts at "decoded".
The encoder is timed by wrapping aiortc's encoder factory (`install_timed_encoders`): a frame that carries an
`EncodeCallback` in `frame.opaque` reports its encode start and end to it; other frames pass untouched.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

EncodeCallback = Callable[[float, float], None]  # (encode started, encode ended), monotonic seconds


class TimedEncoder:
    """An aiortc encoder that reports how long each of our frames took to encode."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def encode(self, frame: Any, force_keyframe: bool = False) -> Any:
        started = time.monotonic()
        result = self._inner.encode(frame, force_keyframe)
        callback = getattr(frame, "opaque", None)
        if callable(callback):
            callback(started, time.monotonic())
        return result

    @property
    def target_bitrate(self) -> int:
        return int(self._inner.target_bitrate)

    @target_bitrate.setter
    def target_bitrate(self, bitrate: int) -> None:
        self._inner.target_bitrate = bitrate

    def __getattr__(self, name: str) -> Any:  # pack(), and anything a later aiortc adds
        return getattr(self._inner, name)
