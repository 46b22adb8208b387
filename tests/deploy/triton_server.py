"""A real `tritonserver` (from the nvidia-pytriton wheel, in its own venv: scripts/setup-triton.sh) serving a
model repository on free loopback ports."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def triton_venv() -> Path:
    venv = Path(os.environ.get("SWAPCAST_TRITON_VENV", ROOT / ".venv-triton"))
    if not list(venv.glob("lib/python3.11/site-packages/pytriton/tritonserver/bin/tritonserver")):
        pytest.skip(f"no tritonserver in {venv} (run scripts/setup-triton.sh)")
    return venv


def _free_ports(count: int) -> list[int]:
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


class TritonServer:
    def __init__(self, repository: Path, work: Path, ports: tuple[int, int, int] | None = None) -> None:
        """`ports` (http, grpc, metrics): those of a server started before, to start it again where its clients
        look for it; free ones by default."""
        venv = triton_venv()
        site = venv / "lib" / "python3.11" / "site-packages"
        home = site / "pytriton" / "tritonserver"
        # The wheel keeps one backend stub per Python version; the backend looks for it beside itself.
        backends = work / "backends" / "python"
        backends.mkdir(parents=True, exist_ok=True)
        for source in (
            home / "backends" / "python" / "libtriton_python.so",
            home / "backends" / "python" / "triton_python_backend_utils.py",
            home / "python_backend_stubs" / "3.11" / "triton_python_backend_stub",
        ):
            (backends / source.name).unlink(missing_ok=True)
            (backends / source.name).symlink_to(source)
        http, grpc, metrics = ports or _free_ports(3)
        self.ports = (http, grpc, metrics)
        self.url = f"127.0.0.1:{grpc}"
        self.log = work / "tritonserver.log"
        env = {
            **os.environ,
            "PATH": f"{venv / 'bin'}:{os.environ.get('PATH', '')}",
            "LD_LIBRARY_PATH": str(site / "nvidia_pytriton.libs"),
        }
        env.pop("PYTHONPATH", None)
        with self.log.open("a") as out:
            self.proc = subprocess.Popen(
                [str(home / "bin" / "tritonserver"), f"--model-repository={repository}",
                 f"--backend-directory={work / 'backends'}", f"--http-port={http}", f"--grpc-port={grpc}",
                 f"--metrics-port={metrics}", "--exit-on-error=true", "--strict-model-config=true"],
                stdout=out, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip

    def wait_ready(self, timeout: float = 90.0) -> TritonServer:
        import tritonclient.grpc as grpcclient
        from tritonclient.utils import InferenceServerException

        client = grpcclient.InferenceServerClient(self.url)
        deadline = time.monotonic() + timeout
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"tritonserver exited: {self.log.read_text()[-3000:]}")
                try:
                    if client.is_server_ready(client_timeout=1.0):
                        return self
                except InferenceServerException:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"tritonserver not ready: {self.log.read_text()[-3000:]}")
                time.sleep(0.2)
        finally:
            client.close()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
