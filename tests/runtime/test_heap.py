"""Freed heap memory handed back to the system: asks close together share one trim, made off the caller's
thread, and the memory a large freed allocation held leaves the process's resident set."""

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from app.runtime.heap import HeapTrimmer
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


def test_asks_close_together_share_one_trim_on_its_own_thread() -> None:
    threads: list[str] = []

    def trim(pad: int) -> int:
        threads.append(threading.current_thread().name)
        return 1

    trimmer = HeapTrimmer(delay_s=0.2, trim=trim)
    for _ in range(3):
        trimmer.soon()
    assert wait_for(lambda: trimmer.trims == 1, 5)
    trimmer.soon()
    assert wait_for(lambda: trimmer.trims == 2, 5)
    assert threads == ["heap-trim", "heap-trim"]


# Run in a fresh interpreter: how much a trim gives back depends on what the process allocated before (torch,
# ONNX Runtime and GStreamer leave arenas of their own behind in the test process), not only on this test.
FRAGMENT_AND_TRIM = """
import ctypes, sys
from app.runtime.heap import HeapTrimmer
from tests.helpers import wait_for

def resident_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6

blocks, live = [], []
for _ in range(3000):  # about 200 MB freed, 3 MB kept
    blocks.append(ctypes.create_string_buffer(64 * 1024))
    live.append(ctypes.create_string_buffer(1024))
del blocks
kept = resident_mb()
trimmer = HeapTrimmer(delay_s=0.0)
trimmer.soon()
assert wait_for(lambda: trimmer.trims == 1, 10)
print(kept, resident_mb(), len(live))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or not HeapTrimmer().available, reason="glibc only")
def test_a_trim_returns_freed_blocks_between_live_ones_to_the_system() -> None:
    # Blocks freed between blocks still in use (fragmentation) stay resident until trimmed: glibc gives back
    # only the heap's free top by itself. The small blocks are over pymalloc's limit, so malloc holds both.
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "MALLOC_ARENA_MAX")} | {
        "PYTHONPATH": str(REPO)
    }
    done = subprocess.run(
        [sys.executable, "-c", FRAGMENT_AND_TRIM], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    kept, after, live = (float(v) for v in done.stdout.split())
    assert after < kept - 100, (kept, after)
    assert live == 3000
