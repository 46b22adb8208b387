"""`OutputPath`: what every reader of a live output takes, wired once: the output's feed (its picture whoever
publishes into it, and the one clock that fills in with the held frame, or a channel's slate, at the path's rate
while nothing comes) into its one shared encode, whose packets the RTSP path, WHEP viewers, SRT callers and
pushes read.

A channel is a path that outlives its publishers (held, then the slate); a session's or stream's own RTSP path is
one whose producer holds its last frame for as long as it pauses. The feed hands the encode every frame it sends,
the sound, and a keyframe request when a new publisher's first frame goes out; readers attach to the encode (which
runs only while one does), ask it for keyframes, and for every frame at the path's rate while a new client probes
the stream (`SharedEncode.probe`). What needs the sound as it comes (the RTSP path's Opus stream, WHEP viewers'
audio) listens to the feed's audio."""

from __future__ import annotations

from app.egress.encode import SharedEncode
from app.live.channel_feed import ChannelFeed
from app.media.encoder import EncoderPolicy
from app.observability import Metrics


class OutputPath:
    def __init__(
        self, feed: ChannelFeed, policy: EncoderPolicy, *, metrics: Metrics | None = None, kind: str = "channel"
    ) -> None:
        """`feed`: the path's picture at its size and rate (its `hold_s`, how long the last frame is held while
        nothing is published: `math.inf` for as long as the producer pauses); `kind` labels the metrics."""
        self.feed = feed
        self.encode = SharedEncode(feed.width, feed.height, feed.fps, policy, feed.name, metrics=metrics, kind=kind)
        self.encode.on_probe = self.feed.probe
        self.feed.output_listeners.append(self.encode.frame)
        self.feed.audio_listeners.append(self.encode.audio)
        self.feed.keyframe_listeners.append(self.encode.keyframe)

    def close(self) -> None:
        """The feed's thread stops; readers still attached see no more packets and detach as they end."""
        self.feed.close()
