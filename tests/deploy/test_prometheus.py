"""A real Prometheus (Debian's) with the repository's scrape config scrapes a real swapcast server: the
swapcast target is up and the session-capacity series the autoscaler uses is there."""

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from app.pipeline.pipeline import FramePipeline
from app.settings import PipelineSettings
from tests.server.harness import server_settings, start_server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=5) as response:
        return dict(json.load(response))


def test_prometheus_scrapes_the_server(
    tmp_path: Path, pipeline_factory: Callable[[PipelineSettings], FramePipeline]
) -> None:
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (scripts/setup-dev.sh installs it)")
    with start_server(server_settings(tmp_path / "identities", max_sessions=3), pipeline_factory) as server:
        web = _free_port()
        config = (ROOT / "deploy" / "prometheus" / "prometheus.yml").read_text()
        config = config.replace("127.0.0.1:8000", f"127.0.0.1:{server.port}").replace(
            "127.0.0.1:9090", f"127.0.0.1:{web}"
        )
        config = config.replace("scrape_interval: 5s", "scrape_interval: 1s")
        (tmp_path / "prometheus.yml").write_text(config)
        proc = subprocess.Popen(
            ["prometheus", f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{web}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            base = f"http://127.0.0.1:{web}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    targets = _get(f"{base}/api/v1/targets")["data"]["activeTargets"]
                    health = {t["labels"]["job"]: t["health"] for t in targets}
                    if health.get("swapcast") == "up":
                        break
                except OSError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, "the swapcast target did not come up"
                time.sleep(0.5)
            result = _get(f"{base}/api/v1/query?query=swapcast_session_capacity")["data"]["result"]
            assert [float(r["value"][1]) for r in result] == [3.0]
        finally:
            proc.terminate()
            proc.wait(15)
