"""RTSP output latency: from `RtspPublisher.push` to the decoded frame in a PyAV client, over loopback.

Every pushed frame (a real face moving, from `make_motion_clip`) carries its id as a row of
black and white blocks along its top edge; the client reads the id back from each decoded
frame and looks up when that frame was pushed. Run as

    python -m app.bench.rtsp_latency [--seconds 10] [--size 640x480] [--producer-fps 12] [--channel|--both]

and it prints one JSON line per size with p50/p95 in milliseconds, the share of distinct frames among
those decoded (a frame sent twice shows its id twice), and how long `ffprobe` and `av.open` took to open
the stream and the first decoded frame came (clients that connect while frames flow, as OBS's media
source does). Frames are pushed into the path's own feed and encode (a session's or a stream's path); with
`--channel` they are offered to a `SharedEncode` the path reads (a channel's, whose feed is the channel's own),
and `--both` measures the two one after the other.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import threading
import time
from typing import Any

import av
import numpy as np
import numpy.typing as npt

from app.egress.encode import SharedEncode
from app.egress.rtsp import RtspServer
from app.live.frame import OutputFrame
from app.media.clips import load_sample, make_motion_clip
from app.media.encoder import EncoderPolicy
from app.media.rtsp_in import LIVE_OPTIONS
from app.pipeline.types import Image
from app.settings import EncoderSettings

ID_BITS = 20
CHECK_BITS = 4
_LEVELS = (16, 235)  # video-range black and white survive the YUV round trip unclipped


def _check(frame_id: int) -> int:
    return (frame_id * 7 + 3) % (1 << CHECK_BITS)


def _code(frame_id: int) -> list[int]:
    if not 0 <= frame_id < 1 << ID_BITS:
        raise ValueError(f"frame id {frame_id} does not fit in {ID_BITS} bits")
    value = (frame_id << CHECK_BITS) | _check(frame_id)
    return [(value >> i) & 1 for i in reversed(range(ID_BITS + CHECK_BITS))]


def stamp_frame_id(image: Image, frame_id: int, block: int = 16) -> Image:
    """Write `frame_id` into the top-left strip of `image` (in place, and returned).

    The strip is `(ID_BITS + CHECK_BITS) * block` pixels wide and `block` high; with `block` a
    multiple of 16 each bit fills whole macroblocks, which H.264 keeps readable."""
    bits = _code(frame_id)
    if image.shape[1] < len(bits) * block or image.shape[0] < block:
        raise ValueError(f"a {image.shape[1]}x{image.shape[0]} image is too small for the stamp")
    for i, bit in enumerate(bits):
        image[:block, i * block : (i + 1) * block] = _LEVELS[bit]
    return image


def read_frame_id(image: npt.NDArray[Any], block: int = 16) -> int | None:
    """The id stamped by `stamp_frame_id`, or None when the strip does not hold a valid one.

    `image` may be BGR or a single luma plane."""
    n = ID_BITS + CHECK_BITS
    if image.shape[1] < n * block or image.shape[0] < block:
        return None
    q = block // 4
    value = 0
    for i in range(n):
        cell = image[q : block - q, i * block + q : (i + 1) * block - q]
        value = (value << 1) | int(float(cell.mean()) > 125.5)
    frame_id = value >> CHECK_BITS
    return frame_id if value & ((1 << CHECK_BITS) - 1) == _check(frame_id) else None


def measure(
    width: int,
    height: int,
    seconds: float,
    fps: int = 30,
    warmup_s: float = 1.5,
    producer_fps: float | None = None,
    channel: bool = False,
) -> dict[str, Any]:
    """Announce `fps`, push stamped frames at `producer_fps` (default `fps`) for about `warmup_s + seconds`
    and time each decoded one; with `channel`, offer them to a shared encode that the path serves."""
    push_fps = producer_fps or fps
    clip = make_motion_clip(load_sample("astronaut"), size=(width, height), frames=2 * fps, fps=fps)
    pushed_at: dict[int, float] = {}
    stop = threading.Event()
    with RtspServer(port=0) as server:
        encode = SharedEncode(width, height, fps, EncoderPolicy(EncoderSettings()), "bench") if channel else None
        publisher = server.publish("bench", width, height, fps, encode=encode)
        offer = (lambda image: encode.frame(OutputFrame(image))) if encode is not None else publisher.push

        def push() -> None:
            next_at = time.perf_counter()
            frame_id = 0
            while not stop.is_set():
                image = stamp_frame_id(clip.frames[frame_id % len(clip)].copy(), frame_id)
                pushed_at[frame_id] = time.perf_counter()
                offer(image)
                frame_id += 1
                next_at += 1 / push_fps
                stop.wait(max(0.0, next_at - time.perf_counter()))

        pusher = threading.Thread(target=push, daemon=True)
        pusher.start()
        time.sleep(0.5)  # frames flow before the client comes
        ffprobe_s = ffprobe_open_s(server.url("bench"))
        latencies: list[float] = []
        ids: list[int] = []
        unreadable = 0
        decoded = 0
        first_frame_s: float | None = None
        try:
            connect = time.perf_counter()
            with av.open(server.url("bench"), options=LIVE_OPTIONS, timeout=(10.0, 5.0)) as container:
                started = time.perf_counter()
                open_s = started - connect
                for frame in container.decode(video=0):
                    now = time.perf_counter()
                    if first_frame_s is None:
                        first_frame_s = now - connect
                    if now - started < warmup_s:
                        continue
                    if now - started > warmup_s + seconds:
                        break
                    decoded += 1
                    frame_id = read_frame_id(frame.to_ndarray(format="gray"))
                    if frame_id is None or frame_id not in pushed_at:
                        unreadable += 1
                        continue
                    ids.append(frame_id)
                    latencies.append(now - pushed_at[frame_id])
        finally:
            stop.set()
            pusher.join()
            publisher.close()
        ms = np.asarray(latencies) * 1000.0
        return {
            "size": f"{width}x{height}",
            "fps": fps,
            "producer_fps": push_fps,
            "path": "channel" if channel else "own",
            "bitrate_kbps": EncoderPolicy(EncoderSettings()).shared_bitrate_kbps(width, height, fps),
            "frames": decoded,
            "unreadable": unreadable,
            "distinct": round(len(set(ids)) / len(ids), 3) if ids else None,
            "open_s": round(open_s, 2),
            "ffprobe_s": ffprobe_s,
            "first_frame_s": round(first_frame_s, 2) if first_frame_s is not None else None,
            "dropped": publisher.feed.dropped,
            "p50_ms": round(float(np.percentile(ms, 50)), 1) if len(ms) else None,
            "p95_ms": round(float(np.percentile(ms, 95)), 1) if len(ms) else None,
            "max_ms": round(float(ms.max()), 1) if len(ms) else None,
        }


def ffprobe_open_s(url: str) -> float | None:
    """Wall time of `ffprobe -show_streams` on `url` (process start-up included), None without ffprobe."""
    if shutil.which("ffprobe") is None:
        return None
    command = ["ffprobe", "-v", "error", "-rtsp_transport", "tcp", "-show_streams", "-of", "json", url]
    started = time.perf_counter()
    subprocess.run(command, capture_output=True, timeout=30, check=True)
    return round(time.perf_counter() - started, 2)


def _size(text: str) -> tuple[int, int]:
    w, _, h = text.partition("x")
    return int(w), int(h)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--producer-fps", type=float, help="push at this rate (default: --fps)")
    parser.add_argument("--size", type=_size, action="append", help="WIDTHxHEIGHT (repeatable)")
    parser.add_argument("--channel", action="store_true", help="a path reading a channel's shared encode")
    parser.add_argument("--both", action="store_true", help="the path's own encode, then a channel's")
    args = parser.parse_args(argv)
    kinds = (False, True) if args.both else (args.channel,)
    for width, height in args.size or [(640, 480), (1280, 720)]:
        for channel in kinds:
            result = measure(width, height, args.seconds, args.fps, producer_fps=args.producer_fps, channel=channel)
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
