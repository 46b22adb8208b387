"""`swapcast serve` on jemalloc: SWAPCAST_ALLOCATOR=jemalloc (and auto) re-execute the server once with the library
preloaded, so it is in the server's own memory map; system keeps glibc's malloc. The choice never fails a start."""

import os
import signal
import subprocess
from pathlib import Path

import pytest

from app.runtime.allocator import (
    JEMALLOC_CONF,
    REEXEC_MARKER,
    find_jemalloc,
    jemalloc_loaded,
    preload_env,
    reexec_library,
)
from tests.helpers import ServeProcess

JEMALLOC = find_jemalloc()
needs_jemalloc = pytest.mark.skipif(JEMALLOC is None, reason="libjemalloc2 is not installed")


def serve_maps(model_root: Path, tmp_path: Path, allocator: str) -> tuple[str, list[str]]:
    """The memory map of a started `serve` (read by its process id, which the re-execution keeps) and its lines."""
    serve = ServeProcess(
        "app.commands.serve",
        ["--port", "0", "--no-rtsp", "--identity-dir", str(tmp_path / "id")],
        model_root,
        stderr=subprocess.STDOUT,  # warnings too: the marker the re-execution sets is no unknown setting
        SWAPCAST_ALLOCATOR=allocator,
    )
    try:
        serve.wait_ready()
        maps = Path(f"/proc/{serve.proc.pid}/maps").read_text()
    finally:
        serve.proc.send_signal(signal.SIGTERM)
        code = serve.proc.wait(30)
    serve.reader.join(5)
    assert code == 0, serve.lines
    return maps, serve.lines


@pytest.mark.slow
@pytest.mark.alone
@needs_jemalloc
@pytest.mark.parametrize("allocator", ["jemalloc", "auto"])
def test_serve_reexecutes_itself_with_jemalloc(model_root: Path, tmp_path: Path, allocator: str) -> None:
    maps, lines = serve_maps(model_root, tmp_path, allocator)
    assert "libjemalloc" in maps
    assert "  allocator   jemalloc" in lines, lines
    assert sum(line.startswith("swapcast serving on") for line in lines) == 1, lines
    assert not [line for line in lines if "is not a setting" in line], lines


@pytest.mark.slow
@pytest.mark.alone
def test_serve_keeps_the_system_allocator_when_told(model_root: Path, tmp_path: Path) -> None:
    maps, lines = serve_maps(model_root, tmp_path, "system")
    assert "libjemalloc" not in maps
    assert "  allocator   system" in lines, lines


def test_no_reexecution_when_system_is_asked_for_or_it_already_happened(monkeypatch: pytest.MonkeyPatch) -> None:
    assert reexec_library("system", {})[0] is None
    # The marker: a process already re-executed never does it again, even if the preload did not take.
    if not jemalloc_loaded():
        library, why = reexec_library("jemalloc", {REEXEC_MARKER: "1"})
        assert library is None and "not loaded" in why
    monkeypatch.setattr("app.runtime.allocator.find_jemalloc", lambda: None)
    if not jemalloc_loaded():
        library, why = reexec_library("jemalloc", {})
        assert library is None and "not installed" in why


def test_preload_env_puts_the_library_first_once_and_keeps_settings() -> None:
    env = preload_env({"LD_PRELOAD": "/x/libother.so /lib/je.so", "PATH": os.defpath}, "/lib/je.so")
    assert env["LD_PRELOAD"] == "/lib/je.so /x/libother.so"
    assert env["MALLOC_CONF"] == JEMALLOC_CONF
    assert preload_env({"MALLOC_CONF": "narenas:2"}, "/lib/je.so")["MALLOC_CONF"] == "narenas:2"
