"""The way out of a push's child process for FFmpeg's HTTP and TLS clients (WHIP, RTMPS): a proxy on loopback
that FFmpeg reaches through `http_proxy`, and that connects to one checked address of one host and nowhere else.

FFmpeg's HTTP client follows a redirect wherever it points and sends its headers, the WHIP Bearer token among
them, with every request; the WHIP muxer passes no option that turns that off. Through the tunnel a request (or
a TLS `CONNECT`) for any other host or port is answered 403 and goes nowhere, so no redirect leaves the host
the push was given and the token never reaches another one. The name stays in the URL FFmpeg opens, so the
HTTP Host header, TLS's server name and its certificate check all see it, while the connection goes to the
address the destination policy checked: a second lookup cannot move it (no DNS-rebinding window).

The tunnel is a process of its own (`python -m app.egress.push_tunnel`, its configuration on stdin): PyAV holds
Python's global lock while FFmpeg connects, so a thread beside the muxer could never answer it. It tells its
port, then each refused host:port, one JSON line each on stdout, and ends with its stdin.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import subprocess
import sys
import threading
from typing import IO
from urllib.parse import urlsplit

from app.processes import start_child

HEAD_MAX = 64 * 1024
CONNECT_TIMEOUT_S = 10.0
FORBIDDEN = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
DEFAULT_PORTS = {"http": 80, "https": 443}


def _same_host(a: str, b: str) -> bool:
    return a.strip("[]").rstrip(".").lower() == b.strip("[]").rstrip(".").lower()


class OneHostTunnel:
    """`host:port` (as the push's URL names it) reached at `address`, through a tunnel process at `url`; what
    it refused is in `refused` (host:port as asked, for the server's log)."""

    def __init__(self, host: str, port: int, address: str) -> None:
        self.host, self.port, self.address = host, port, address
        self._refused: list[str] = []
        self._process = start_child("app.egress.push_tunnel", {"host": host, "port": port, "address": address})
        assert self._process.stdout is not None
        self._stdout: IO[bytes] = self._process.stdout
        ready, _, _ = select.select([self._stdout], [], [], CONNECT_TIMEOUT_S)
        line = self._stdout.readline() if ready else b""
        if not line:
            self.close()
            raise OSError("the push's tunnel did not start")
        self.url = f"http://127.0.0.1:{json.loads(line)['port']}"

    @property
    def refused(self) -> list[str]:
        """Hosts the tunnel refused so far."""
        while select.select([self._stdout], [], [], 0)[0]:
            line = self._stdout.readline()
            if not line:
                break
            self._refused.append(str(json.loads(line)["refused"]))
        return self._refused

    def close(self) -> None:
        with contextlib.suppress(OSError):
            assert self._process.stdin is not None
            self._process.stdin.close()
        try:
            self._process.wait(2)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


class _Tunnel:
    """The tunnel process's side."""

    def __init__(self, host: str, port: int, address: str) -> None:
        self.host, self.port, self.address = host, port, address
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port_here = int(self._server.getsockname()[1])
        self._lock = threading.Lock()

    def report(self, **line: object) -> None:
        with self._lock:
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()

    def accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name="push-tunnel-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        with client:
            client.settimeout(CONNECT_TIMEOUT_S)
            head = b""
            try:
                while b"\r\n\r\n" not in head and len(head) < HEAD_MAX:
                    chunk = client.recv(4096)
                    if not chunk:
                        return
                    head += chunk
            except OSError:
                return
            head, _, rest = head.partition(b"\r\n\r\n")
            first, _, headers = head.partition(b"\r\n")
            forward = self._target(first.decode("latin-1"))
            if forward is None:
                with contextlib.suppress(OSError):
                    client.sendall(FORBIDDEN)
                return
            try:
                upstream = socket.create_connection((self.address, self.port), timeout=CONNECT_TIMEOUT_S)
            except OSError:
                with contextlib.suppress(OSError):
                    client.sendall(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                return
            with upstream:
                client.settimeout(None)
                upstream.settimeout(None)
                if forward == "tunnel":
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                    upstream.sendall(rest)
                else:  # a plain HTTP request, from absolute form to origin form
                    upstream.sendall(forward.encode("latin-1") + b"\r\n" + headers + b"\r\n\r\n" + rest)
                _relay(client, upstream)

    def _target(self, request_line: str) -> str | None:
        """`tunnel` for a CONNECT to the host, the request line to send for a plain request to it, else None."""
        try:
            method, target, version = request_line.split(" ")
            if method.upper() == "CONNECT":
                host, _, port_text = target.rpartition(":")
                if _same_host(host, self.host) and int(port_text) == self.port:
                    return "tunnel"
            else:
                parts = urlsplit(target)
                port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 0)
                if parts.scheme.lower() == "http" and _same_host(parts.hostname or "", self.host) and port == self.port:
                    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                    return f"{method} {path} {version}"
        except ValueError:
            pass
        self.report(refused=_where(request_line))
        return None


def _where(request_line: str) -> str:
    """host:port a refused request asked for (never its path or query, which may carry a secret)."""
    fields = request_line.split(" ")
    target = fields[1] if len(fields) > 1 else ""
    netloc = urlsplit(target).netloc if "://" in target else target
    return netloc.rpartition("@")[2][:200] or "?"


def _relay(a: socket.socket, b: socket.socket) -> None:
    """Bytes both ways until one side ends."""

    def pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    back = threading.Thread(target=pump, args=(b, a), daemon=True)
    back.start()
    pump(a, b)
    back.join()


def main() -> int:
    config = json.loads(sys.stdin.readline())
    tunnel = _Tunnel(str(config["host"]), int(config["port"]), str(config["address"]))
    threading.Thread(target=tunnel.accept, name="push-tunnel", daemon=True).start()
    tunnel.report(port=tunnel.port_here)
    while os.read(sys.stdin.fileno(), 4096):  # until the push's process closes it, or ends
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
