"""`serve` as a user runs it: one command prints the URLs, becomes ready, and SIGTERM stops it cleanly (exit 0)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.helpers import ServeProcess

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_prints_urls_becomes_ready_and_stops_on_sigterm(tmp_path: Path, model_root: Path) -> None:
    identity_dir = tmp_path / "identities"
    serve = ServeProcess(
        "app.commands.serve", ["--port", "0", "--no-rtsp", "--identity-dir", str(identity_dir)], model_root
    )
    proc, lines = serve.proc, serve.lines
    try:
        serve.wait_ready()
        first = lines[0]
        assert first.startswith("swapcast serving on http://127.0.0.1:"), lines
        base = first.rsplit(" ", 1)[1]
        text = "\n".join(lines)
        assert f"page        {base}/" in text
        assert "RTSP        off (disabled by SWAPCAST_RTSP_ENABLED=false)" in text
        assert "engine      mesh" in text  # no swap weights in the test model directory: the weightless default
        assert f"identities  {identity_dir}" in text
        assert httpx.get(f"{base}/readyz").json()["engine"] == "mesh"
        assert "swapcast" in httpx.get(f"{base}/").text
        assert identity_dir.is_dir()
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    serve.reader.join(5)
    assert code == 0, (code, proc.stderr.read() if proc.stderr else "")
    assert lines[-1] == "swapcast: stopped"


@pytest.mark.slow
def test_serve_refuses_a_port_in_use(tmp_path: Path, model_root: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "app.commands.serve", "--port", str(port), "--no-rtsp"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO)},
        )
    assert result.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr
