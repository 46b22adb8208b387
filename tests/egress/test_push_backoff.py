"""A push to a destination that accepts the connection and never answers backs off: every attempt that ends
(here killed by the watchdog, as the server kills a child that does not open in time) makes the next pause
longer, up to the most, instead of starting a new child process at the same pace forever; the pause and the
next attempt's time are in the push's stats. The server's worker slots bound how many attempts run at once: a
push beyond them waits, "queued". Real child processes (`app.egress.push_worker`) and a real RTMP client
(FFmpeg's, in the child) against a loopback server; the watchdog's and the reset's times are shortened so that
a few attempts fit in seconds."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from app.egress import push as push_module
from app.egress import push_worker
from app.egress.encode import SharedEncode
from app.egress.push import Push, WorkerSlots
from app.egress.push_destination import Destination
from app.egress.push_worker import ProcessSink
from app.live.frame import OutputFrame
from app.media.encoder import EncoderPolicy
from app.settings import EncoderSettings
from tests.helpers import wait_for

FPS = 15
START_S = 2.0  # the watchdog's time for a child to open once it takes packets (the server's is 15 s)
BACKOFF = (0.2, 1.6)


class Attempts:
    """The push's opener: real child processes (`ProcessSink`), with when each attempt began and ended."""

    def __init__(self) -> None:
        self.began: list[float] = []
        self.ended: list[float] = []

    def __call__(self, destination: Destination, width: int, height: int, fps: int) -> Attempt:
        self.began.append(time.monotonic())
        return Attempt(ProcessSink(destination, width, height, fps), self.ended)

    def pauses(self) -> list[float]:
        """The time between each attempt's end and the next one's start."""
        return [b - e for e, b in zip(self.ended, self.began[1:], strict=False)]


class Attempt:
    def __init__(self, sink: ProcessSink, ended: list[float]) -> None:
        self._sink, self._ended = sink, ended
        self.state, self.wants_packets, self.sent, self.send = sink.state, sink.wants_packets, sink.sent, sink.send

    def close(self) -> None:
        self._sink.close()
        self._ended.append(time.monotonic())


class SilentServer:
    """Accepts every TCP connection on 127.0.0.1 and never sends a byte; records when each came."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = int(self.sock.getsockname()[1])
        self.accepted: list[float] = []
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted.append(time.monotonic())
            self._held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    server = SilentServer()
    yield server
    server.close()


@pytest.fixture
def encode() -> Iterator[SharedEncode]:
    """The channel's encode, fed a grey picture at its rate as the channel's feed would."""
    encode = SharedEncode(160, 120, FPS, EncoderPolicy(EncoderSettings()), "backoff")
    frame = OutputFrame(np.full((120, 160, 3), 90, np.uint8))
    stop = threading.Event()

    def feed() -> None:
        while not stop.wait(1 / FPS):
            encode.frame(frame)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    yield encode
    stop.set()
    thread.join()


@pytest.fixture
def short_times(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(push_worker, "START_S", START_S)
    # Attempts last longer than this; before, that alone started the pauses over.
    monkeypatch.setattr(push_module, "STABLE_S", 1.0)


@pytest.mark.usefixtures("short_times")
def test_a_destination_that_accepts_and_never_answers_gets_ever_longer_pauses(
    silent: SilentServer, encode: SharedEncode
) -> None:
    destination = Destination.parse(f"rtmp://127.0.0.1:{silent.port}/live/key")
    attempts = Attempts()
    push = Push("p-silent", destination, encode, backoff_s=BACKOFF[0], backoff_max_s=BACKOFF[1], opener=attempts)
    seen: list[dict] = []
    push.start()
    try:
        deadline = time.monotonic() + 120
        while len(attempts.ended) < 5 and time.monotonic() < deadline:
            stats = push.stats()
            if stats["state"] == "retrying":
                seen.append(stats)
            time.sleep(0.05)
    finally:
        push.close()
    pauses = attempts.pauses()
    print("pauses between attempts:", [round(p, 2) for p in pauses])
    assert len(pauses) >= 4, pauses
    assert len(silent.accepted) >= 4  # each attempt reached the server, which took it and said nothing
    # Each pause doubles up to the most, though every attempt lasted longer than a stable connection must.
    expected = [min(BACKOFF[0] * 2**n, BACKOFF[1]) for n in range(len(pauses))]
    for pause, wanted in zip(pauses, expected, strict=True):
        assert wanted - 0.05 <= pause <= wanted + 0.5, (pauses, expected)
    # While it waits, the push says how long and until when, and how many attempts ended.
    assert seen and all(s["retry_in_s"] is not None and s["next_retry_at"] > 0 for s in seen)
    assert max(s["retry_in_s"] for s in seen) >= BACKOFF[1] * 0.7
    assert max(s["failures"] for s in seen) >= 4
    assert push.stats()["state"] == "stopped" and push.stats()["retry_in_s"] is None


@pytest.mark.usefixtures("short_times")
def test_a_push_beyond_the_servers_worker_slots_waits_queued_until_one_is_free(
    silent: SilentServer, encode: SharedEncode
) -> None:
    slots = WorkerSlots(1)
    destination = Destination.parse(f"rtmp://127.0.0.1:{silent.port}/live/key")
    first = Push("p-1", destination, encode, backoff_s=5.0, backoff_max_s=5.0, slots=slots)
    second = Push("p-2", destination, encode, backoff_s=5.0, backoff_max_s=5.0, slots=slots)
    first.start()
    try:
        assert wait_for(lambda: len(silent.accepted) == 1, 20)
        second.start()
        time.sleep(0.5)
        # One child at a time: the second waits while the first one's attempt runs.
        assert (first.stats()["state"], second.stats()["state"]) == ("connecting", "queued")
        assert len(silent.accepted) == 1
        # The first one's attempt ends (the watchdog) and it pauses: the second takes the slot.
        assert wait_for(lambda: len(silent.accepted) == 2, 20)
        assert first.stats()["state"] in ("retrying", "queued")
        assert second.stats()["state"] == "connecting"
    finally:
        first.close()
        second.close()
