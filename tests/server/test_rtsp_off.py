"""Without GStreamer the server still imports, starts its RTSP side as off, and says why."""

import subprocess
import sys
from pathlib import Path

import pytest

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
