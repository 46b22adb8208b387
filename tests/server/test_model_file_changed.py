"""A model file truncated or replaced on disk: at start-up the server stays not ready and names the file; while
it runs, it keeps serving from the copy it loaded and says so (log, `/readyz`, `/v1/server`, a metric)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from engines.store import ModelStore
from tests.helpers import ServeProcess, wait_for
from tests.server.harness import upload

MODEL = "retinaface_mnet025"
URL = re.compile(r"http://127\.0\.0\.1:\d+")


def serve(tmp_path: Path, models: Path) -> ServeProcess:
    args = ["--port", "0", "--no-rtsp", "--engine", "classic", "--identity-dir", str(tmp_path / "identities")]
    return ServeProcess("app.commands.serve", args, models, stderr=subprocess.STDOUT)


def base_url(process: ServeProcess) -> str:
    """The address serve announces (its log lines come on the same stream, so not necessarily first)."""

    def announced() -> bool:
        return any(URL.search(line) for line in process.lines)

    assert wait_for(announced, 60), process.lines
    match = next(m for m in map(URL.search, process.lines) if m)
    return match.group(0)


def stop(process: ServeProcess) -> None:
    process.proc.terminate()
    try:
        process.proc.wait(20)
    except subprocess.TimeoutExpired:
        process.proc.kill()
        process.proc.wait()


def own_models(store: ModelStore, tmp_path: Path) -> Path:
    """A copy of the test models (the detector made first) this test may damage."""
    store.ensure(MODEL)
    models = tmp_path / "models"
    shutil.copytree(store.root, models, ignore=shutil.ignore_patterns(".*"))
    return models


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:4096])


@pytest.mark.slow
def test_a_truncated_model_file_keeps_the_server_not_ready_naming_the_file(store: ModelStore, tmp_path: Path) -> None:
    models = own_models(store, tmp_path)
    damaged = models / f"{MODEL}.onnx"
    truncate(damaged)
    process = serve(tmp_path, models)
    try:
        base = base_url(process)

        def load_failed() -> bool:
            try:
                reply = httpx.get(f"{base}/readyz", timeout=5)
            except httpx.TransportError:
                return False
            return reply.status_code == 503 and reply.json()["reason"].startswith("model load failed")

        assert wait_for(load_failed, 60), process.lines
        reason = httpx.get(f"{base}/readyz", timeout=5).json()["reason"]
        assert f"model {MODEL} at {damaged} is corrupt" in reason
        assert httpx.get(f"{base}/healthz", timeout=5).status_code == 200
        assert damaged.stat().st_size == 4096  # refused, not silently made again
        assert any(f"{damaged} is corrupt" in line for line in process.lines), process.lines
    finally:
        stop(process)


@pytest.mark.slow
def test_a_model_file_changed_while_serving_leaves_the_loaded_copy_serving_and_says_so(
    store: ModelStore, tmp_path: Path, tom_png: bytes
) -> None:
    models = own_models(store, tmp_path)
    process = serve(tmp_path, models)
    try:
        base = base_url(process.wait_ready(90))
        ready = httpx.get(f"{base}/readyz", timeout=5).json()
        assert "note" not in ready
        assert httpx.get(f"{base}/v1/server", timeout=5).json()["models_changed_on_disk"] == {}

        truncate(models / f"{MODEL}.onnx")

        ready = httpx.get(f"{base}/readyz", timeout=5)
        assert ready.status_code == 200
        note = f"model {MODEL} changed on disk since it was loaded: serving the loaded copy"
        assert ready.json() == {"status": "ready", "engine": "classic", "note": note}
        assert httpx.get(f"{base}/v1/server", timeout=5).json()["models_changed_on_disk"] == {MODEL: "changed"}
        assert "swapcast_model_files_changed 1.0" in httpx.get(f"{base}/metrics", timeout=5).text
        created = upload(base, tom_png)  # the detector still runs: from the copy loaded at start-up
        assert created.status_code == 201, created.text
        logged = [line for line in process.lines if f"model {MODEL}: {models / MODEL}.onnx was changed" in line]
        assert len(logged) == 1, process.lines
    finally:
        stop(process)
