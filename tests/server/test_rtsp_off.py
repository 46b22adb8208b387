"""Without GStreamer, or with its port taken, the server still starts, its RTSP side off, and says why."""

import asyncio
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from app.bench.rtc_client import RtcClient
from app.media.clips import MotionClip
from engines.store import ModelStore
from tests.helpers import ServeProcess
from tests.server.harness import upload

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_the_server_runs_without_gstreamer_and_says_why_rtsp_is_off() -> None:
    code = (
        "import sys\n"
        "sys.modules['gi'] = None\n"
        "from app.server.app import create_app\n"
        "from app.server.rtsp import RtspOutput\n"
        "output = RtspOutput(enabled=True, port=0, host='127.0.0.1', public_host='127.0.0.1')\n"
        "output.start()\n"
        "print('available:', output.available)\n"
        "print('reason:', output.reason)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "available: False" in out.stdout
    assert "reason: RTSP server did not start: RTSP is not available: PyGObject is not installed" in out.stdout


@pytest.mark.slow
def test_with_the_rtsp_port_taken_sessions_go_on_and_rtsp_is_reported_off_with_the_reason(
    tmp_path: Path, model_root: Path, store: ModelStore, tom_png: bytes, clip: MotionClip
) -> None:
    store.ensure("retinaface_mnet025")
    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        args = ["--port", "0", "--rtsp-port", str(port), "--identity-dir", str(tmp_path / "identities")]
        serve = ServeProcess("tests.deploy.loopback_serve", args, model_root, SWAPCAST_ENGINE="classic")
        try:
            base = serve.wait_ready(90).base_url
            reason = f"RTSP server did not start: cannot serve RTSP on 127.0.0.1:{port}: "
            assert any(line.startswith(f"  RTSP        off ({reason}") for line in serve.lines), "\n".join(serve.lines)
            assert httpx.get(f"{base}/readyz", timeout=10).status_code == 200
            rtsp = httpx.get(f"{base}/v1/server", timeout=10).json()["rtsp"]
            assert rtsp["available"] is False and rtsp["reason"].startswith(reason), rtsp
            assert "swapcast_rtsp_available 0.0" in httpx.get(f"{base}/metrics", timeout=10).text

            identity = upload(base, tom_png).json()["id"]

            async def session() -> None:
                client = RtcClient(clip.frames, fps=15)
                async with httpx.AsyncClient(base_url=base, timeout=30) as http:
                    await client.connect(http, f"/v1/sessions?identity={identity}")
                    assert await client.wait_frames(5, 60), "the session sent no frames back"
                    await http.delete(client.location or "")
                    await client.close()

            asyncio.run(session())
        finally:
            serve.proc.kill()
            serve.proc.wait(20)
