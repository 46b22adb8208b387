"""The readers `swapcast bench egress` puts on a channel, each its own process so that none of their CPU is the
server's or the benchmark's: FFmpeg reading RTSP (as OBS's media source does) and calling SRT, a receive-only
aiortc WHEP viewer (`python -m app.bench.egress_clients whep URL`), and nginx with its RTMP module as the
destination of the channel's pushes, on loopback ports.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from app.processes import wait_or_kill

NGINX_RTMP_MODULE = Path("/usr/lib/nginx/modules/ngx_rtmp_module.so")


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def readers_unavailable() -> str | None:
    """Why the readers cell cannot run here (a tool it needs is missing), or None."""
    if shutil.which("ffmpeg") is None:
        return "ffmpeg is not installed"
    if shutil.which("nginx") is None or not NGINX_RTMP_MODULE.exists():
        return "nginx with its RTMP module is not installed (apt-get install nginx-light libnginx-mod-rtmp)"
    protocols = subprocess.run(["ffmpeg", "-hide_banner", "-protocols"], capture_output=True, text=True).stdout
    if "\n  srt\n" not in protocols.split("Output:")[0]:
        return "this ffmpeg cannot read SRT"
    return None


class Client:
    """A reader process; stopped with SIGTERM (SIGKILL after a grace), its last words kept for the report."""

    def __init__(self, kind: str, argv: list[str], log: Path) -> None:
        self.kind = kind
        self.log = log
        with log.open("wb") as out:
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        wait_or_kill(self.process, 5)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-300:] if self.log.exists() else ""


def ffmpeg_reader(kind: str, url: str, log: Path) -> Client:
    """FFmpeg reading `url` and copying it to nothing: a consumer as the server sees it, without a player's
    decoding, which would only take the small benchmark machine's CPU from the server measured."""
    options = ["-rtsp_transport", "tcp"] if url.startswith("rtsp") else []
    argv = ["ffmpeg", "-nostdin", "-hide_banner", "-loglevel", "warning", *options, "-i", url, "-c", "copy"]
    argv += ["-f", "null", "-"]
    return Client(kind, argv, log)


def whep_viewer(url: str, log: Path) -> Client:
    return Client("whep", [sys.executable, "-m", "app.bench.egress_clients", "whep", url], log)


class NginxRtmp:
    """nginx in the foreground (one process) with an RTMP server on a free port, where the pushes publish."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        directory.mkdir(parents=True, exist_ok=True)
        config = directory / "nginx.conf"
        config.write_text(
            f"load_module {NGINX_RTMP_MODULE};\n"
            "daemon off;\nmaster_process off;\n"
            f"pid {directory}/nginx.pid;\nerror_log {directory}/error.log warn;\n"
            "events { worker_connections 64; }\n"
            f"rtmp {{ server {{ listen 127.0.0.1:{self.port}; application live {{ live on; }} }} }}\n"
        )
        self.process = subprocess.Popen(
            ["nginx", "-c", str(config), "-p", str(directory)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + 10
        while not self._listening():
            if time.monotonic() > deadline or self.process.poll() is not None:
                self.stop()
                raise RuntimeError(f"nginx did not listen: {self._log()[-300:]}")
            time.sleep(0.05)

    def _listening(self) -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0

    def _log(self) -> str:
        path = self.directory / "error.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def url(self, key: str) -> str:
        return f"rtmp://127.0.0.1:{self.port}/live/{key}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
        wait_or_kill(self.process, 10)


async def _watch(url: str) -> None:
    """Receive `url` over WHEP until killed, decoding every frame (as a browser would)."""
    import httpx
    from aiortc import RTCConfiguration, RTCPeerConnection, RTCSessionDescription

    from app.bench.rtc_client import video_frames

    pc = RTCPeerConnection(RTCConfiguration(iceServers=[]))
    pc.addTransceiver("video", direction="recvonly")
    remote: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    @pc.on("track")
    def on_track(track: object) -> None:
        if not remote.done():
            remote.set_result(track)

    await pc.setLocalDescription(await pc.createOffer())
    async with httpx.AsyncClient(timeout=30) as http:
        answer = await http.post(url, content=pc.localDescription.sdp, headers={"Content-Type": "application/sdp"})
        answer.raise_for_status()
        await pc.setRemoteDescription(RTCSessionDescription(sdp=answer.text, type="answer"))
        frames = 0
        try:
            async for _, _frame in video_frames(await remote):  # type: ignore[arg-type]
                frames += 1
        finally:
            print(f"whep frames {frames}", flush=True)
            await pc.close()


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "whep":
        print("usage: python -m app.bench.egress_clients whep URL", file=sys.stderr)
        return 2
    from app.media.peer import use_host_addresses

    use_host_addresses(["127.0.0.1"])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_watch(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
