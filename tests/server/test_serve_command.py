"""`serve` as a user runs it: one command prints the URLs, becomes ready, and SIGTERM stops it cleanly (exit 0)."""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_serve_prints_urls_becomes_ready_and_stops_on_sigterm(tmp_path: Path, model_root: Path) -> None:
    identity_dir = tmp_path / "identities"
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.commands.serve", "--port", "0", "--no-rtsp", "--identity-dir", str(identity_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO)},
    )
    lines: list[str] = []
    ready = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("ready:"):
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert ready.wait(90), lines
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
    reader.join(5)
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
