"""A live core and its outputs run without a server (as a transport would drive them): frames in at a rate, each
processed and handed to the core's output listeners, which may publish into a channel path whose shared encode
readers collect. Output behaviour (fan-out, the one encode, keyframes, fill-in) is tested here in seconds; the
server tests keep only what needs the protocols."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from app.egress.encode import EncodedPacket
from app.egress.path import OutputPath
from app.live.core import LiveCore
from app.live.frame import OutputFrame
from app.media.clips import load_sample
from app.observability import Metrics
from app.pipeline.pipeline import FramePipeline
from app.pipeline.timing import StageTimer
from app.pipeline.types import Image


@dataclass
class PacketReader:
    """A shared encode's reader that keeps what it gets; `fail_after`: raises on every packet after that many."""

    audio_codec: str | None = None
    fail_after: int | None = None
    packets: list[EncodedPacket] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def packet(self, packet: EncodedPacket) -> None:
        with self._lock:
            if self.fail_after is not None and len(self.packets) >= self.fail_after:
                raise RuntimeError("this reader broke")
            self.packets.append(packet)

    def video(self) -> list[EncodedPacket]:
        with self._lock:
            return [p for p in self.packets if p.video]


def live_core(pipeline: FramePipeline, metrics: Metrics, kind: str = "session", name: str = "harness") -> LiveCore:
    return LiveCore(
        kind=kind,
        name=name,
        identity_id="tom",
        source=pipeline.prepare_source(load_sample("tom_hanks")),
        pipeline=pipeline,
        metrics=metrics,
    )


def run_frames(core: LiveCore, frames: Iterable[Image], fps: float) -> list[OutputFrame]:
    """Each frame in, processed and handed to the core's outputs, at `fps` (as a camera would send them)."""
    interval = 1.0 / fps
    started = time.monotonic()
    outputs = []
    for index, image in enumerate(frames):
        arrived = time.monotonic()
        core.frame_in(arrived)
        timer = StageTimer()
        outputs.append(core.finished(core.process(image, timer), timer))
        core.frame_out(arrived)
        delay = started + (index + 1) * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    return outputs


def publish_into(core: LiveCore, path: OutputPath) -> str:
    """`core` publishes into the channel path from its next frame, as the server's channels attach it."""
    key = f"{core.kind}/{core.name}"
    path.feed.attach(key)
    core.output_listeners.append(lambda frame: path.feed.publish(key, frame))
    return key
