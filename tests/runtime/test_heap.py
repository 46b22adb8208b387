"""Freed heap memory handed back to the system: asks close together share one trim, made off the caller's
thread, and the memory a large freed allocation held leaves the process's resident set."""

import ctypes
import sys
import threading

import pytest

from app.runtime.heap import HeapTrimmer
from tests.helpers import wait_for


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 1e6


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


@pytest.mark.skipif(not sys.platform.startswith("linux") or not HeapTrimmer().available, reason="glibc only")
def test_a_trim_returns_freed_blocks_between_live_ones_to_the_system() -> None:
    # Blocks freed between blocks still in use (fragmentation) stay resident until trimmed: glibc gives back
    # only the heap's free top by itself. The small blocks are over pymalloc's limit, so malloc holds both.
    blocks, live = [], []
    for _ in range(3000):  # about 200 MB freed, 3 MB kept
        blocks.append(ctypes.create_string_buffer(64 * 1024))
        live.append(ctypes.create_string_buffer(1024))
    del blocks
    kept = resident_mb()
    trimmer = HeapTrimmer(delay_s=0.0)
    trimmer.soon()
    assert wait_for(lambda: trimmer.trims == 1, 10)
    assert resident_mb() < kept - 100, (kept, resident_mb())
    assert len(live) == 3000
