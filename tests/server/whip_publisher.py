"""A WHIP publisher that is not aiortc: FFmpeg's `whip` muxer (through PyAV), as OBS and `ffmpeg -f whip` publish,
sending H.264 and Opus with a Bearer key.

It runs in a process of its own, as a real publisher does: PyAV holds the GIL while the muxer writes its header
(the WHIP offer and answer, ICE and DTLS), so a server in the same process could not answer it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import av
import numpy as np

from app.media.whip_certificate import write_certificate
from app.pipeline.types import Image

AUDIO_RATE = 48000
KEY_VARIABLE = "WHIP_PUBLISHER_KEY"  # the Bearer key reaches the child in its environment, never its arguments
P256_VARIABLE = "WHIP_PUBLISHER_P256"  # set: the muxer's DTLS uses a P-256 certificate (app/media/whip_certificate.py)


def whip_unavailable_reason() -> str | None:
    """Why this PyAV build cannot publish over WHIP, or None."""
    if "whip" not in av.formats_available:
        return "the FFmpeg that PyAV bundles has no whip muxer"
    missing = [c for c in ("libx264", "libopus") if c not in av.codecs_available]
    if missing:
        return f"the FFmpeg that PyAV bundles has no {' or '.join(missing)} encoder"
    return None


class WhipPublisher:
    """Publishes `frames` in a loop at `fps` to a WHIP endpoint with `key` as its Bearer token until stopped."""

    def __init__(
        self, url: str, key: str | None, frames: Sequence[Image], directory: Path, fps: int = 15, p256: bool = True
    ) -> None:
        clip = directory / "whip-frames.npy"
        np.save(clip, np.stack(frames))
        self.log = directory / "whip-publisher.log"
        env = {**os.environ, **({KEY_VARIABLE: key} if key else {}), **({P256_VARIABLE: "1"} if p256 else {})}
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.server.whip_publisher", url, str(clip), str(fps)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    @property
    def failed(self) -> bool:
        return self.process.poll() is not None

    def output(self) -> str:
        """The publisher's log (FFmpeg's messages and any error), its last lines."""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-40:])

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def publish(url: str, key: str | None, frames: np.ndarray, fps: int, certificate: dict[str, str]) -> None:
    options = {**({"authorization": key} if key else {}), **certificate}
    with av.open(url, "w", format="whip", options=options, timeout=(20, 10)) as container:
        height, width = frames.shape[1:3]
        video = container.add_stream("libx264", rate=fps)
        video.width, video.height, video.pix_fmt = width, height, "yuv420p"
        # WebRTC's H.264: constrained baseline (no B-frames), a key frame every second, low latency.
        video.codec_context.options = {"preset": "veryfast", "tune": "zerolatency", "profile": "baseline"}
        video.codec_context.gop_size = fps
        audio = container.add_stream("libopus", rate=AUDIO_RATE)
        audio.codec_context.layout = "stereo"
        samples = AUDIO_RATE // fps
        start = time.monotonic()
        index = 0
        while True:
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(frames[index % len(frames)]), format="bgr24")
            frame.pts, frame.time_base = index, Fraction(1, fps)
            for packet in video.encode(frame):
                container.mux(packet)
            silence = av.AudioFrame.from_ndarray(np.zeros((1, samples * 2), np.int16), format="s16", layout="stereo")
            silence.sample_rate, silence.pts = AUDIO_RATE, index * samples
            for packet in audio.encode(silence):
                container.mux(packet)
            index += 1
            if index == 1 or index % (fps * 5) == 0:
                print(f"sent {index} frames", flush=True)
            delay = start + index / fps - time.monotonic()
            if delay > 0:
                time.sleep(delay)


if __name__ == "__main__":
    import logging

    import av.logging

    logging.basicConfig(level=logging.DEBUG, format="%(name)s %(message)s")

    av.logging.set_level(av.logging.DEBUG if os.environ.get("WHIP_PUBLISHER_DEBUG") else av.logging.INFO)
    clip = Path(sys.argv[2])
    certificate = write_certificate(clip.parent) if os.environ.get(P256_VARIABLE) else {}
    publish(sys.argv[1], os.environ.get(KEY_VARIABLE), np.load(clip), int(sys.argv[3]), certificate)
