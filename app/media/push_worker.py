"""A push's encoder and muxer in a process of its own: `ProcessSink` in the server, `main` in the child.

FFmpeg's network muxers, as PyAV calls them, hold Python's global lock while they connect and write: a
destination that answers slowly would freeze every thread of the server (measured: an RTMP server that accepts
and never answers froze a ticking thread for as long as the connection hung, past PyAV's own timeouts). So the
server hands each push's raw frames (I420) and sound (48 kHz stereo float) to a child process through a pipe,
and the child encodes and sends them (`app.media.push_sinks`). The child reports on its stdout, one JSON line
each: `open`, then `progress` (bytes sent since the last report, whether a peer takes the stream) about four
times a second, or `error` with the destination's secrets hidden. The configuration, secrets included, goes
in on stdin, never on the command line; FFmpeg's own messages (which may quote the URL) are discarded.

A child that stops reporting for `STALL_S` while frames are waiting is killed: the push then reconnects.
"""

from __future__ import annotations

import contextlib
import fractions
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any

import av
import numpy as np

from app.media.encoder import EncoderPolicy
from app.media.push_destination import Destination
from app.media.push_sinks import AUDIO_RATE, IO_TIMEOUT_S, OPEN_TIMEOUT_S, PushSinkError, open_sink
from app.settings import EncoderSettings

# kind (V/A), pts, keyframe, payload size
HEADER = struct.Struct("<cqBI")
REPORT_S = 0.25
STALL_S = IO_TIMEOUT_S
START_S = OPEN_TIMEOUT_S + 5.0  # the child's own start (imports) and the connection


class ProcessSink:
    """The server's side: a child process per connection."""

    def __init__(self, destination: Destination, width: int, height: int, fps: int, policy: EncoderPolicy) -> None:
        self.width, self.height = width, height
        self._destination = destination
        self._lock = threading.Lock()
        self._opened = threading.Event()
        self._error: str | None = None
        self._connected = False
        self._unreported = 0
        self._last_report = time.monotonic()
        self.audio_frame_samples = 1024
        self._process = subprocess.Popen(
            [sys.executable, "-m", "app.media.push_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._stdin: IO[bytes] = self._process.stdin
        config = {
            "destination": destination.to_json(),
            "width": width,
            "height": height,
            "fps": fps,
            "encoder": policy.settings.model_dump(mode="json"),
        }
        self._reader = threading.Thread(target=self._read, args=(self._process.stdout,), daemon=True)
        self._reader.start()
        with contextlib.suppress(OSError):  # the child is gone: its report, or its absence, says why
            self._stdin.write((json.dumps(config) + "\n").encode())
            self._stdin.flush()
        if not self._opened.wait(START_S) or self._error is not None:
            error = self._error or "the destination did not answer in time"
            self.close()
            raise PushSinkError(error)

    def _read(self, stdout: IO[bytes]) -> None:
        """The child's reports; the watchdog that kills a child that stopped reporting."""
        fd = stdout.fileno()
        buffer = b""
        while True:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                buffer += chunk
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    self._report(json.loads(line))
            elif self._opened.is_set() and time.monotonic() - self._last_report > STALL_S:
                with self._lock:
                    self._error = self._error or f"the destination took nothing for {STALL_S:.0f} s"
                self._process.kill()
        with self._lock:
            self._error = self._error or "the push process ended"
        self._opened.set()

    def _report(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._last_report = time.monotonic()
            event = report.get("event")
            if event == "open":
                self.audio_frame_samples = int(report["audio_frame_samples"])
                self._opened.set()
            elif event == "progress":
                self._unreported += int(report["bytes"])
                self._connected = bool(report["connected"])
            elif event == "error":
                self._error = str(report["message"])
                self._opened.set()

    def connected(self) -> bool:
        with self._lock:
            if self._error is not None:
                raise PushSinkError(self._error)
            return self._connected

    def sent(self) -> int:
        """Bytes the child sent since the last call."""
        with self._lock:
            sent, self._unreported = self._unreported, 0
            return sent

    def send_video(self, i420: np.ndarray[Any, np.dtype[np.uint8]], pts: int, keyframe: bool) -> None:
        self._send(b"V", pts, keyframe, i420)

    def send_audio(self, planar: np.ndarray[Any, np.dtype[np.float32]], pts: int) -> None:
        self._send(b"A", pts, False, planar)

    def _send(self, kind: bytes, pts: int, keyframe: bool, data: np.ndarray[Any, Any]) -> None:
        payload = np.ascontiguousarray(data).tobytes()
        try:
            self._stdin.write(HEADER.pack(kind, pts, int(keyframe), len(payload)) + payload)
        except OSError:
            self.connected()  # raises the child's reason
            raise PushSinkError("the push process ended") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._stdin.close()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(5)
        self._reader.join(5)


def _emit(**report: Any) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


def _read_exactly(stream: IO[bytes], size: int) -> bytes | None:
    data = stream.read(size)
    return data if len(data) == size else None


def main() -> int:
    stdin = sys.stdin.buffer
    config = json.loads(stdin.readline())
    destination = Destination.from_json(config["destination"])
    width, height, fps = int(config["width"]), int(config["height"]), int(config["fps"])
    policy = EncoderPolicy(EncoderSettings(**config["encoder"]))
    try:
        sink = open_sink(destination, width, height, fps, policy)
    except Exception as exc:  # reported to the server, secrets hidden
        _emit(event="error", message=destination.redact(str(exc) or type(exc).__name__))
        return 1
    _emit(event="open", audio_frame_samples=sink.audio_frame_samples)
    sent, reported = 0, time.monotonic()
    try:
        while True:
            head = _read_exactly(stdin, HEADER.size)
            if head is None:
                break
            kind, pts, keyframe, size = HEADER.unpack(head)
            payload = _read_exactly(stdin, size)
            if payload is None:
                break
            if kind == b"V":
                planes = np.frombuffer(payload, np.uint8).reshape(height * 3 // 2, width)
                frame = av.VideoFrame.from_numpy_buffer(planes, format="yuv420p")
                frame.pts, frame.time_base = pts, fractions.Fraction(1, fps)
                frame.pict_type = av.video.frame.PictureType.I if keyframe else av.video.frame.PictureType.NONE
                sent += sink.send_video(frame)
            else:
                samples = np.frombuffer(payload, np.float32).reshape(2, -1)
                audio = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples), format="fltp", layout="stereo")
                audio.sample_rate = AUDIO_RATE
                audio.pts, audio.time_base = pts, fractions.Fraction(1, AUDIO_RATE)
                sent += sink.send_audio(audio)
            if time.monotonic() - reported >= REPORT_S:
                _emit(event="progress", bytes=sent, connected=sink.connected())
                sent, reported = 0, time.monotonic()
    except Exception as exc:  # the destination dropped the push
        _emit(event="error", message=destination.redact(str(exc) or type(exc).__name__))
        return 1
    finally:
        sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
