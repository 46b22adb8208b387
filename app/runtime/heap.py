"""Handing freed heap memory back to the system once a session, stream or viewer has ended.

A session's decoders, encoders, frames and peer connection are freed when it ends, but glibc's allocator keeps
what they used in its arenas (one per thread that allocated, up to eight per core) rather than returning it:
the server's resident size then stays at its high-water mark after every client has left, and grows with the
arenas' fragmentation. `malloc_trim(0)` returns the free pages of every arena. It runs on a thread of its own,
a moment after the end it was asked for (ends close together share one trim), never on the event loop. On a C
library without it (musl, macOS), or with jemalloc as the allocator (app/runtime/allocator.py), nothing is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable

from app.runtime.allocator import jemalloc_loaded

log = logging.getLogger(__name__)

DELAY_S = 2.0  # after an end, for its threads to finish and its buffers to be freed


def _libc_trim() -> Callable[[int], int] | None:
    if jemalloc_loaded():  # glibc's arenas then hold next to nothing; jemalloc returns pages on its own (decay)
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


class HeapTrimmer:
    """`soon()` asks for one trim `delay_s` from now; asks while one is pending join it. `trims` counts those
    done, `last_s` is how long the last one took."""

    def __init__(self, delay_s: float = DELAY_S, trim: Callable[[int], int] | None = None) -> None:
        self.delay_s = delay_s
        self._trim = trim if trim is not None else _libc_trim()
        self._lock = threading.Lock()
        self._pending: threading.Timer | None = None
        self.trims = 0
        self.last_s = 0.0

    @property
    def available(self) -> bool:
        return self._trim is not None

    def soon(self) -> None:
        if self._trim is None:
            return
        with self._lock:
            if self._pending is not None:
                return
            timer = self._pending = threading.Timer(self.delay_s, self._run)
            timer.name = "heap-trim"
            timer.daemon = True
            timer.start()

    def _run(self) -> None:
        with self._lock:
            self._pending = None
        assert self._trim is not None
        started = time.perf_counter()
        try:
            self._trim(0)
        except Exception:  # never fatal: the memory stays with the allocator
            log.exception("malloc_trim failed")
            return
        self.last_s = time.perf_counter() - started
        self.trims += 1

    def cancel(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, None
        if pending is not None:
            pending.cancel()
