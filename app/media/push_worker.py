"""A push's muxer in a process of its own: `ProcessSink` in the server, `main` in the child.

FFmpeg's network muxers, as PyAV calls them, hold Python's global lock while they connect and write: a
destination that answers slowly would freeze every thread of the server (measured: an RTMP server that accepts
and never answers froze a ticking thread for as long as the connection hung, past PyAV's own timeouts). So the
server hands each push's packets, encoded once for all the channel's pushes (`app.media.push_encode`), to a
child process through a pipe, and the child muxes and sends them (`app.media.push_sinks`). The child reports on
its stdout, one JSON line each: `ready` once it runs and its sink is made (the push then starts taking packets:
none wait in the pipe while Python starts), `open` on the first packet (a keyframe), then `progress` (bytes
sent since the last report, whether a peer takes the stream) about four times a second, or `error` with the
destination's secrets hidden. The configuration, secrets included, goes in on stdin, never on the command
line; FFmpeg's own messages (which may quote the URL) are discarded.

A child that has not opened within `START_S`, or stops reporting for `STALL_S` once open, is killed: the push
then reconnects.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import subprocess
import sys
import threading
import time
from typing import IO, Any, Literal

from app.media.push_destination import Destination
from app.media.push_encode import EncodedPacket
from app.media.push_sinks import IO_TIMEOUT_S, OPEN_TIMEOUT_S, PushSinkError, Sink, open_sink
from app.processes import wait_or_kill

# video (1) or sound (0), pts in microseconds, keyframe, payload size
HEADER = struct.Struct("<BqBI")
REPORT_S = 0.25
STALL_S = IO_TIMEOUT_S
START_S = OPEN_TIMEOUT_S + 5.0  # the child's own start (imports) and the connection

SinkState = Literal["starting", "connecting", "waiting", "live"]


class ProcessSink:
    """The server's side: a child process per connection. `state` says how it goes, and raises once it failed."""

    def __init__(self, destination: Destination, width: int, height: int, fps: int) -> None:
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._ready = False
        self._opened = False
        self._error: str | None = None
        self._connected = False
        self._unreported = 0
        self._last_report = time.monotonic()
        self._process = subprocess.Popen(
            [sys.executable, "-m", "app.media.push_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._stdin: IO[bytes] = self._process.stdin
        config = {"destination": destination.to_json(), "width": width, "height": height, "fps": fps}
        self._reader = threading.Thread(target=self._read, args=(self._process.stdout,), daemon=True)
        self._reader.start()
        with contextlib.suppress(OSError):  # the child is gone: its report, or its absence, says why
            self._stdin.write((json.dumps(config) + "\n").encode())
            self._stdin.flush()

    def _read(self, stdout: IO[bytes]) -> None:
        """The child's reports; the watchdog that kills a child that does not open, or stopped reporting."""
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
                continue
            with self._lock:
                if not self._opened and time.monotonic() - self._started > START_S:
                    self._error = self._error or "the destination did not answer in time"
                elif self._opened and time.monotonic() - self._last_report > STALL_S:
                    self._error = self._error or f"the destination took nothing for {STALL_S:.0f} s"
                else:
                    continue
            self._process.kill()
        with self._lock:
            self._error = self._error or "the push process ended"

    def _report(self, report: dict[str, Any]) -> None:
        with self._lock:
            self._last_report = time.monotonic()
            event = report.get("event")
            if event == "ready":
                self._ready = True
            elif event == "open":
                self._opened = True
                self._connected = bool(report["connected"])
            elif event == "progress":
                self._unreported += int(report["bytes"])
                self._connected = bool(report["connected"])
            elif event == "error":
                self._error = str(report["message"])

    def state(self) -> SinkState:
        with self._lock:
            if self._error is not None:
                raise PushSinkError(self._error)
            if not self._opened:
                return "connecting" if self._ready else "starting"
            return "live" if self._connected else "waiting"

    def sent(self) -> int:
        """Bytes the child sent since the last call."""
        with self._lock:
            sent, self._unreported = self._unreported, 0
            return sent

    def send(self, packet: EncodedPacket, pts_us: int) -> None:
        """Blocks while the child's pipe is full (the child is slow): the push's own thread, never the encode's."""
        head = HEADER.pack(int(packet.video), pts_us, int(packet.keyframe), len(packet.data))
        try:
            self._stdin.write(head + packet.data)
        except OSError:
            self.state()  # raises the child's reason
            raise PushSinkError("the push process ended") from None

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._stdin.close()
        wait_or_kill(self._process, 5)
        self._reader.join(5)


def _emit(**report: Any) -> None:
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()


def _read_packet(stream: IO[bytes]) -> tuple[bool, bytes, int, bool] | None:
    head = stream.read(HEADER.size)
    if len(head) != HEADER.size:
        return None
    video, pts, keyframe, size = HEADER.unpack(head)
    payload = stream.read(size)
    return (bool(video), payload, pts, bool(keyframe)) if len(payload) == size else None


def main() -> int:
    stdin = sys.stdin.buffer
    config = json.loads(stdin.readline())
    destination = Destination.from_json(config["destination"])
    width, height, fps = int(config["width"]), int(config["height"]), int(config["fps"])
    sink: Sink | None = None
    try:
        # Opened before the first packet: an SRT caller starts connecting now (FFmpeg's protocols connect when
        # the first packet writes the header).
        sink = open_sink(destination, width, height, fps)
        _emit(event="ready")
        # What a peer gets starts on a keyframe: nothing goes out before the sink takes the stream (an SRT
        # listener's caller, or a caller's connection, may come later; the server asks for a keyframe then).
        keyed, sent, reported = False, 0, None
        while (packet := _read_packet(stdin)) is not None:
            video, _, _, keyframe = packet
            keyed = keyed or (video and keyframe and sink.connected())
            if keyed:
                sent += sink.send(*packet)  # the first one writes the header
            if reported is None:
                _emit(event="open", connected=sink.connected())
                reported = time.monotonic()
            elif time.monotonic() - reported >= REPORT_S:
                _emit(event="progress", bytes=sent, connected=sink.connected())
                sent, reported = 0, time.monotonic()
    except Exception as exc:  # unreachable, refused, or dropped: reported to the server, secrets hidden
        _emit(event="error", message=destination.redact(str(exc) or type(exc).__name__))
        return 1
    finally:
        if sink is not None:
            with contextlib.suppress(Exception):  # the destination went away: nothing more to write
                sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
