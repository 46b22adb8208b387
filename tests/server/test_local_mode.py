"""Local mode as a user meets it: on loopback with nothing configured `serve` says it runs as the local
principal; on another address it refuses to start with one line unless anonymous use is asked for, loudly."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.auth.keys import KeyStore

REPO = Path(__file__).resolve().parents[2]


def serve(args: list[str], model_root: Path, tmp_path: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "app.cli",
            "serve",
            "--port",
            "0",
            "--no-rtsp",
            "--identity-dir",
            str(tmp_path),
            *args,
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO), **env},
    )


def first_lines(proc: subprocess.Popen[str], until: str, timeout: float = 60) -> list[str]:
    lines: list[str] = []
    seen = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith(until):
                seen.set()
                return

    threading.Thread(target=read, daemon=True).start()
    seen.wait(timeout)
    return lines


def get_when_listening(url: str, timeout: float = 20.0, **kwargs: Any) -> httpx.Response:
    """GET `url`, retrying while the socket is not accepting yet: the banner is printed during start-up,
    just before the server accepts connections."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return httpx.get(url, **kwargs)
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    return proc.stderr.read() if proc.stderr else ""


@pytest.mark.slow
def test_a_non_loopback_bind_without_credentials_refuses_with_one_line(tmp_path: Path, model_root: Path) -> None:
    proc = serve(["--host", "0.0.0.0"], model_root, tmp_path, SWAPCAST_KEYS_FILE=str(tmp_path / "none.json"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out == ""
    assert err.strip().splitlines() == [
        "swapcast: error: refusing to serve on 0.0.0.0 without credentials: create a key with "
        "`swapcast keys create NAME --scope admin` (or configure SWAPCAST_JWT_*), "
        "or set SWAPCAST_ALLOW_ANONYMOUS=true to let anyone who can reach it in"
    ]


@pytest.mark.slow
def test_a_non_loopback_bind_with_a_key_starts_and_says_keys_are_needed(tmp_path: Path, model_root: Path) -> None:
    keys = tmp_path / "keys.json"
    KeyStore(keys).create("admin", ["admin"])
    proc = serve(["--host", "0.0.0.0"], model_root, tmp_path, SWAPCAST_KEYS_FILE=str(keys))
    try:
        lines = first_lines(proc, "  loading models")
        assert any(line.startswith("  access      Authorization: Bearer, API keys (1 active") for line in lines), lines
        assert "  content     stop: explicit uploads refused, live sessions and streams ended" in lines, lines
    finally:
        stop(proc)


@pytest.mark.slow
def test_anonymous_use_on_a_network_address_is_allowed_only_loudly(tmp_path: Path, model_root: Path) -> None:
    proc = serve(
        ["--host", "0.0.0.0"],
        model_root,
        tmp_path,
        SWAPCAST_KEYS_FILE=str(tmp_path / "none.json"),
        SWAPCAST_ALLOW_ANONYMOUS="true",
    )
    try:
        lines = first_lines(proc, "  loading models")
        assert any(line.startswith("  access      ANONYMOUS") for line in lines), lines
    finally:
        err = stop(proc)
    assert "WARNING: SWAPCAST_ALLOW_ANONYMOUS=true" in err


@pytest.mark.slow
def test_loopback_without_credentials_runs_as_the_local_principal(tmp_path: Path, model_root: Path) -> None:
    proc = serve([], model_root, tmp_path, SWAPCAST_KEYS_FILE=str(tmp_path / "none.json"))
    try:
        lines = first_lines(proc, "  loading models")
        assert (
            "  access      local mode: no keys or tokens configured, every request here acts as the local principal"
            in lines
        )
        assert any(line.startswith("  content     off (SWAPCAST_CONTENT_POLICY=") for line in lines), lines
    finally:
        stop(proc)


@pytest.mark.slow
def test_metrics_need_the_scope_except_on_the_loopback_metrics_port(tmp_path: Path, model_root: Path) -> None:
    keys = tmp_path / "keys.json"
    KeyStore(keys).create("admin", ["admin"])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    proc = serve([], model_root, tmp_path, SWAPCAST_KEYS_FILE=str(keys), SWAPCAST_METRICS_PORT=str(metrics_port))
    try:
        lines = first_lines(proc, "  loading models")
        base = lines[0].rsplit(" ", 1)[1]
        assert f"  metrics     http://127.0.0.1:{metrics_port}/metrics (loopback only, no credentials)" in lines
        assert get_when_listening(f"{base}/metrics").status_code == 401
        scraped = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics")
        assert scraped.status_code == 200 and "swapcast_ready" in scraped.text
    finally:
        stop(proc)
