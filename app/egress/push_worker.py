"""A push's muxer in a process of its own: `ProcessSink` in the server, `main` in the child.

FFmpeg's network muxers, as PyAV calls them, hold Python's global lock while they connect and write: a
destination that answers slowly would freeze every thread of the server (measured: an RTMP server that accepts
and never answers froze a ticking thread for as long as the connection hung, past PyAV's own timeouts). So the
server hands each push's packets, encoded once for all the channel's pushes (`app.egress.encode`), to a
child process through a pipe, and the child muxes and sends them (`app.egress.push_sinks`). The child reports on
its stdout, one JSON line each: `ready` once it runs and its sink is made, with whether the sink takes packets
now (RTMP and WHIP connect on their first packet; an SRT sink only once its peer is there), `open` on the first
packet (a keyframe), then `progress` (bytes sent since the last report, whether a peer takes the stream) about
four times a second, packets or not, or `error` with the destination's secrets hidden. The push sends packets
only while the child's sink takes them: none wait in the pipe while Python starts, and a listener with no
caller costs the channel no encode. Each packet is flushed into the pipe as it is written: a quiet picture
(the slate) makes packets of a few bytes, which a buffered pipe would hold for seconds. The configuration,
secrets included, goes in on stdin, never on the command line; FFmpeg's own messages (which may quote the URL)
are discarded.

A child that has not started within `READY_S`, or has not opened within `START_S` of taking packets, or stops
reporting for `STALL_S` otherwise, is killed: the push then reconnects.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import struct
import sys
import threading
import time
from typing import IO, Any, Literal

from app.egress.encode import EncodedPacket
from app.egress.push_destination import Destination
from app.egress.push_errors import FailureClass, PushFailed, classify
from app.egress.push_policy import PushPolicy, Route, route
from app.egress.push_sinks import IO_TIMEOUT_S, OPEN_TIMEOUT_S, PushSinkError, Sink, open_sink
from app.processes import start_child, wait_or_kill

# video (1) or sound (0), pts in microseconds, keyframe, payload size
HEADER = struct.Struct("<BqBI")
REPORT_S = 0.25
STALL_S = IO_TIMEOUT_S
READY_S = 15.0  # the child's own start (imports, its sink made) on a busy machine
START_S = OPEN_TIMEOUT_S + 5.0  # the connection, from the first packet sent

SinkState = Literal["starting", "connecting", "waiting", "live"]


class ProcessSink:
    """The server's side: a child process per connection. `state` says how it goes, and raises once it failed."""

    def __init__(
        self, destination: Destination, width: int, height: int, fps: int, policy: PushPolicy | None = None
    ) -> None:
        """`policy`: where the child may connect, checked again at each connection (none: anywhere)."""
        self._lock = threading.Lock()
        self._started = time.monotonic()
        self._ready = False
        self._opened = False
        self._error: str | None = None
        self._error_kind: FailureClass | None = None  # the child's class of its error
        self._connected = False
        self._connected_at = self._started  # when the sink last began taking packets (START_S runs from it)
        self._listener = destination.mode == "listener"
        self._unreported = 0
        self._last_report = time.monotonic()
        config: dict[str, Any] = {"destination": destination.to_json(), "width": width, "height": height, "fps": fps}
        if policy is not None:
            config["policy"] = policy.to_json()
        self._process = start_child("app.egress.push_worker", config)
        assert self._process.stdin is not None and self._process.stdout is not None
        self._stdin: IO[bytes] = self._process.stdin
        self._reader = threading.Thread(target=self._read, args=(self._process.stdout,), daemon=True)
        self._reader.start()

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
            # Looked at after every report too: a child that reports on time may still never open.
            with self._lock:
                now = time.monotonic()
                # Opening may block the child (FFmpeg connects on the first packet): START_S covers it. Otherwise
                # the child reports every REPORT_S, packets or not.
                opening = self._connected and not self._opened
                if not self._ready:
                    if now - self._started > READY_S:
                        self._error = self._error or "the destination did not answer in time"
                    else:
                        continue
                elif opening and now - self._connected_at > START_S:
                    self._error = self._error or "the destination did not answer in time"
                elif not opening and now - self._last_report > STALL_S:
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
                self._set_connected(bool(report["connected"]))
            elif event == "open":
                self._opened = True
                self._set_connected(bool(report["connected"]))
            elif event == "progress":
                self._unreported += int(report["bytes"])
                self._set_connected(bool(report["connected"]))
            elif event == "error":
                self._error = str(report["message"])
                self._error_kind = report.get("kind")

    def _set_connected(self, connected: bool) -> None:
        if connected and not self._connected:
            self._connected_at = time.monotonic()
        self._connected = connected

    def state(self) -> SinkState:
        with self._lock:
            if self._error is not None:
                raise PushFailed(self._error, self._error_kind or classify(PushSinkError(self._error)))
            if not self._ready:
                return "starting"
            if not self._connected:  # an SRT sink without its peer: a listener waits, a caller connects
                return "waiting" if self._listener else "connecting"
            return "live" if self._opened else "connecting"

    def wants_packets(self) -> bool:
        """Whether the child's sink takes packets now (RTMP, WHIP: from the start; SRT: while a peer is there)."""
        with self._lock:
            return self._ready and self._connected and self._error is None

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
            self._stdin.flush()  # now, not once the pipe's buffer fills: a quiet picture's packets are tiny
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


Packet = tuple[bool, bytes, int, bool]  # video, payload, pts, keyframe


class _Input:
    """The child's stdin, read as it comes: the configuration line, then packets, each awaited at most a while
    (the child reports on time whether packets come or not)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self.ended = False

    def line(self) -> bytes:
        while b"\n" not in self._buffer and self._fill(None):
            pass
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line

    def packet(self, timeout: float) -> Packet | None:
        """The next packet; None when none came within `timeout` or the input ended (`ended`)."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self._buffer) >= HEADER.size:
                video, pts, keyframe, size = HEADER.unpack_from(self._buffer)
                end = HEADER.size + size
                if len(self._buffer) >= end:
                    payload = bytes(self._buffer[HEADER.size : end])
                    del self._buffer[:end]
                    return bool(video), payload, pts, bool(keyframe)
            if not self._fill(max(0.0, deadline - time.monotonic())):
                return None

    def _fill(self, timeout: float | None) -> bool:
        """More bytes read; False at the end of the input or when none came within `timeout`."""
        if self.ended:
            return False
        ready, _, _ = select.select([self._fd], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self._fd, 1 << 20)
        if not chunk:
            self.ended = True
            return False
        self._buffer += chunk
        return True


def main() -> int:
    stdin = _Input(sys.stdin.fileno())
    config = json.loads(stdin.line())
    destination = Destination.from_json(config["destination"])
    width, height, fps = int(config["width"]), int(config["height"]), int(config["fps"])
    policy = PushPolicy.from_json(config["policy"]) if config.get("policy") else None
    sink: Sink | None = None
    way = Route(destination)
    try:
        # The host checked again now, and the connection made to the checked address (app.egress.push_policy).
        way = route(policy, destination) if policy is not None else way
        if way.tunnel is not None:  # FFmpeg's HTTP and TLS clients reach the destination through it only
            os.environ["http_proxy"] = way.tunnel.url
            os.environ.pop("no_proxy", None)
            os.environ.pop("NO_PROXY", None)
        # Opened before the first packet: an SRT caller starts connecting now (FFmpeg's protocols connect when
        # the first packet writes the header).
        sink = open_sink(way.destination, width, height, fps)
        _emit(event="ready", connected=sink.connected())
        # What a peer gets starts on a keyframe: nothing goes out before the sink takes the stream (an SRT
        # listener's caller, or a caller's connection, may come later; the server asks for a keyframe then).
        keyed, sent, opened, reported = False, 0, False, time.monotonic()
        while not stdin.ended:
            packet = stdin.packet(REPORT_S)
            if packet is not None:
                video, _, _, keyframe = packet
                keyed = keyed or (video and keyframe and sink.connected())
                if keyed:
                    sent += sink.send(*packet)  # the first one writes the header
                if not opened:
                    _emit(event="open", connected=sink.connected())
                    opened, reported = True, time.monotonic()
                    continue
            if time.monotonic() - reported >= REPORT_S and not stdin.ended:
                _emit(event="progress", bytes=sent, connected=sink.connected())
                sent, reported = 0, time.monotonic()
    except Exception as exc:  # unreachable, refused, or dropped: reported to the server, secrets hidden
        message = way.destination.redact(destination.redact(str(exc) or type(exc).__name__))
        kind = classify(exc)
        if way.tunnel is not None and way.tunnel.refused:  # a redirect elsewhere: the policy refused it
            message += f" (refused: it sent the push on to {', '.join(way.tunnel.refused[:3])}, another host)"
            kind = "policy"
        _emit(event="error", message=message, kind=kind)
        return 1
    finally:
        if sink is not None:
            with contextlib.suppress(Exception):  # the destination went away: nothing more to write
                sink.close()
        way.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
