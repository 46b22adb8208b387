"""Small TCP servers on loopback for the ingest tests: hostile RTSP sources, an internal port that counts who
connects, a relay that counts requests on their way to a real RTSP server."""

import re
import socket
import threading


class LoopbackServer:
    """A listening socket on `host` whose thread hands every connection to `handle`; `close` stops it. A subclass
    sets its own state before calling `__init__` (connections may come at once)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock = socket.socket()
        self._sock.bind((host, 0))
        self._sock.listen(8)
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.handle(conn)

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sock.close()


def reply_head(status: bytes, request: bytes) -> bytes:
    """An RTSP reply's status line and CSeq header (the request's, else 1), ending in a line break."""
    cseq = re.search(rb"CSeq: *(\d+)", request)
    return status + b"\r\nCSeq: " + (cseq.group(1) if cseq else b"1") + b"\r\n"
