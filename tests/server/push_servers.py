"""Local servers that pushes go to, as the platforms' ingest would take them: nginx with its RTMP module, and
`srt-live-transmit` (libsrt's own tool) as an SRT listener or caller. Each is a real process on 127.0.0.1 with
a free port; where its Debian package is missing, `*_unavailable()` says which to install."""

from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import av
import numpy as np

from tests.server.channel_clients import Seen, what_it_shows

NGINX_RTMP_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def nginx_unavailable() -> str | None:
    if shutil.which("nginx") is None:
        return "nginx is not installed (apt-get install nginx-light libnginx-mod-rtmp)"
    if not NGINX_RTMP_MODULE.exists():
        return f"nginx's RTMP module is missing ({NGINX_RTMP_MODULE}: apt-get install libnginx-mod-rtmp)"
    return None


def srt_tools_unavailable() -> str | None:
    if shutil.which("srt-live-transmit") is None:
        return "srt-live-transmit is not installed (apt-get install srt-tools)"
    return None


class NginxRtmp:
    """nginx in the foreground with an RTMP server on a free port: `rtmp://127.0.0.1:PORT/live/KEY` is published
    to and played back from the same URL."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        self.directory = directory
        self.port = port or free_port()
        self.process: subprocess.Popen[bytes] | None = None
        directory.mkdir(parents=True, exist_ok=True)
        self.config = directory / "nginx.conf"
        self.config.write_text(
            f"load_module {NGINX_RTMP_MODULE};\n"
            "daemon off;\n"
            "master_process off;\n"  # one process, stopped with it
            f"pid {directory}/nginx.pid;\n"
            f"error_log {directory}/error.log info;\n"
            "events { worker_connections 64; }\n"
            f"rtmp {{ server {{ listen 127.0.0.1:{self.port}; application live {{ live on; }} }} }}\n"
        )

    def url(self, key: str) -> str:
        return f"rtmp://127.0.0.1:{self.port}/live/{key}"

    def start(self) -> NginxRtmp:
        self.process = subprocess.Popen(
            ["nginx", "-c", str(self.config), "-p", str(self.directory)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        raise RuntimeError(f"nginx did not listen: {(self.directory / 'error.log').read_text()[-500:]}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(10)
            self.process = None

    def log(self) -> str:
        path = self.directory / "error.log"
        return path.read_text() if path.exists() else ""

    def __enter__(self) -> NginxRtmp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class SrtTransmit:
    """`srt-live-transmit SOURCE file://con`, its output (MPEG-TS) kept in a file."""

    def __init__(self, source: str, out: Path) -> None:
        self.out = out
        self._file = out.open("wb")
        self.process = subprocess.Popen(
            ["srt-live-transmit", "-q", source, "file://con"], stdout=self._file, stderr=subprocess.PIPE
        )

    def stop(self) -> str:
        """Stops it; what it said on stderr."""
        self.process.terminate()
        try:
            _, err = self.process.communicate(timeout=10)
        finally:
            self._file.close()
        return err.decode(errors="replace")


class Reader:
    """Reads a URL (or file) with PyAV on its own thread: what each video frame showed and how much sound came."""

    def __init__(self, url: str, options: dict[str, str] | None = None) -> None:
        self.url = url
        self.options = options or {}
        self.seen = Seen()
        self.size: tuple[int, int] | None = None
        self.audio: dict[str, object] = {}
        self.audio_samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            with av.open(self.url, options=self.options, timeout=(20, 10)) as container:
                streams = [s for s in container.streams if s.type in ("video", "audio")]
                for packet in container.demux(streams):
                    for frame in packet.decode():
                        if isinstance(frame, av.VideoFrame):
                            self.size = (frame.width, frame.height)
                            image = np.asarray(frame.to_ndarray(format="bgr24"), np.uint8)
                            self.seen.frames.append((time.monotonic(), what_it_shows(image)))
                        elif isinstance(frame, av.AudioFrame):
                            codec = packet.stream.codec_context
                            self.audio = {"codec": codec.name, "rate": frame.sample_rate}
                            self.audio_samples += frame.samples
                    if self._stop.is_set():
                        return
        except Exception as exc:  # recorded: the tests look at what came and what failed
            self.seen.errors.append(repr(exc))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=20)
