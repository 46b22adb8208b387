"""`python -m app.bench.push_bench`: the server's CPU for a channel's pushes, one encode shared against one encode
per push, in the same run.

`pushes` RTMP pushes of one channel (3 by default) go to local receivers (`ffmpeg -listen 1 ... -c copy -f null`,
not counted), fed a moving clip of a real face at the channel's size and rate and a 48 kHz tone, as the
channel's feed would. Measured over `seconds` after `warmup_s`, as % of one core: this process (the
conversion, the encodes and the pushes' threads: what the server spends) and the pushes' child processes (the
muxers). Twice: `separate` (each push its own `SharedEncode`: what each push cost before they shared one) and
`shared` (one `SharedEncode` for all, as the server runs them). Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import av
import numpy as np

from app.egress.encode import AUDIO_RATE, SharedEncode
from app.egress.push import Push
from app.egress.push_destination import Destination
from app.live.frame import OutputFrame
from app.media.clips import load_sample, make_motion_clip
from app.media.encoder import EncoderPolicy
from app.settings import EncoderSettings

AUDIO_CHUNK = 960  # 20 ms, as WebRTC sound comes


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (0 when it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _push_children() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                command = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if int(stat[1]) == os.getpid() and b"push_worker" in command:
                found.append(int(entry.name))
    return found


class _Feed:
    """The channel's feed: a new frame every tick and 20 ms of tone at a time, to every listener."""

    def __init__(self, frames: list[np.ndarray[Any, Any]], fps: int) -> None:
        self.frames, self.fps = frames, fps
        self.listeners: list[Any] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        start, tick, sent = time.monotonic(), 0, 0
        tone = (0.1 * np.sin(2 * np.pi * 440 * np.arange(AUDIO_CHUNK) / AUDIO_RATE)).astype(np.float32)
        while not self._stop.is_set():
            frame = OutputFrame(self.frames[tick % len(self.frames)])
            for listener in self.listeners:
                listener.frame(frame)
            tick += 1
            while sent * AUDIO_CHUNK < tick * AUDIO_RATE / self.fps:
                for listener in self.listeners:
                    audio = av.AudioFrame.from_ndarray(np.stack([tone, tone]), format="fltp", layout="stereo")
                    audio.sample_rate = AUDIO_RATE
                    listener.audio(audio, 0.0)
                sent += 1
            self._stop.wait(max(0.0, start + tick / self.fps - time.monotonic()))


def measure(mode: str, pushes: int, frames: list[Any], fps: int, seconds: float, warmup_s: float) -> dict[str, Any]:
    height, width = frames[0].shape[:2]
    policy = EncoderPolicy(EncoderSettings())
    ports = [_free_port() for _ in range(pushes)]
    receivers = [
        subprocess.Popen(
            ["ffmpeg", "-nostdin", "-v", "quiet", "-listen", "1", "-i", f"rtmp://127.0.0.1:{port}/live/k"]
            + ["-c", "copy", "-f", "null", "-"],
        )
        for port in ports
    ]
    time.sleep(1.0)  # the receivers listen
    feed = _Feed(frames, fps)
    shared = SharedEncode(width, height, fps, policy, "bench")
    encodes = [shared] if mode == "shared" else [SharedEncode(width, height, fps, policy, "bench") for _ in ports]
    feed.listeners = list(encodes)
    running = [
        Push(f"p{i}", Destination.parse(f"rtmp://127.0.0.1:{port}/live/k"), encodes[i % len(encodes)])
        for i, port in enumerate(ports)
    ]
    feed.start()
    for push in running:
        push.start()
    try:
        time.sleep(warmup_s)
        children = {pid: _cpu_s(pid) for pid in _push_children()}
        own, started = time.process_time(), time.monotonic()
        time.sleep(seconds)
        own = time.process_time() - own
        ended = {pid: _cpu_s(pid) for pid in _push_children()}
        elapsed = time.monotonic() - started
        # A child that ended inside the window (its push reconnected) is left out, and counted.
        theirs = sum(ended[pid] - cpu for pid, cpu in children.items() if pid in ended)
        replaced = sum(1 for pid in children if pid not in ended)
        states = [push.stats() for push in running]
    finally:
        for push in running:
            push.close()
        feed.stop()
        for receiver in receivers:
            receiver.kill()
            receiver.wait()
    return {
        "mode": mode,
        "encodes": len(encodes),
        "server_cpu_pct": round(100 * own / elapsed, 1),
        "push_children_cpu_pct": round(100 * theirs / elapsed, 1),
        "total_cpu_pct": round(100 * (own + theirs) / elapsed, 1),
        "push_states": [s["state"] for s in states],
        "push_children_replaced": replaced,
        "reconnects": [s["reconnects"] for s in states],
        "frames_sent": [s["frames_sent"] for s in states],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--pushes", type=int, default=3)
    parser.add_argument("--width", type=int, default=1280)
    parser.add_argument("--height", type=int, default=720)
    parser.add_argument("--fps", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--warmup-s", type=float, default=5.0)
    args = parser.parse_args()
    clip = make_motion_clip(load_sample("astronaut"), size=(args.width, args.height), frames=args.fps * 2)
    frames = clip.frames + clip.frames[::-1]  # back and forth: no jump where it loops
    results = [
        measure(mode, args.pushes, frames, args.fps, args.seconds, args.warmup_s) for mode in ("separate", "shared")
    ]
    print(
        json.dumps(
            {
                "pushes": args.pushes,
                "size": f"{args.width}x{args.height}@{args.fps}",
                "cpus": os.cpu_count(),
                "machine": platform.machine(),
                "results": results,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
