"""The C allocator the server runs on: glibc's malloc, or jemalloc preloaded when it is installed.

A long-running server fragments glibc's heap: many threads (aiortc and PyAV codecs, GStreamer, ONNX Runtime)
each allocate in an arena of their own (up to eight per core), a client's buffers are freed across them, and
the resident size climbs by megabytes per client joining and leaving though the Python objects stay flat
(docs/operations/benchmarks.md, "Long runs"). jemalloc keeps per-thread caches small and hands freed pages back
to the system on its own after `dirty_decay_ms`, so the same churn leaves far less behind.

An allocator has to be in place before the first allocation, so it cannot be switched inside a running
process: `swapcast serve` re-executes itself once with `LD_PRELOAD` naming the library (`reexec_library`), and
`bench-soak --allocator` starts its server child with the same environment (`preload_env`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

# `auto` takes jemalloc where it is installed; a benchmark names one of the others to know what it measured.
NAMED_ALLOCATORS = ("system", "jemalloc")
ALLOCATORS = ("auto", *NAMED_ALLOCATORS)
JEMALLOC_SONAME = "libjemalloc.so.2"
# Where Debian, Ubuntu, Fedora and source builds put it (the multiarch directory first).
JEMALLOC_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib",
)
# Background threads purge freed pages without waiting for the next allocation; one second of decay hands them
# back soon after a client leaves, at little cost to the frame loop (a setting already in MALLOC_CONF wins).
JEMALLOC_CONF = "background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:1000"
# Set in the environment of the re-executed process, so that it never re-executes again.
REEXEC_MARKER = "SWAPCAST_ALLOCATOR_REEXEC"


def find_jemalloc(dirs: tuple[str, ...] = JEMALLOC_DIRS) -> str | None:
    """The path of the installed jemalloc library, or None."""
    for directory in dirs:
        path = Path(directory) / JEMALLOC_SONAME
        if path.is_file():
            return str(path)
    return None


def jemalloc_loaded(pid: int | str = "self") -> bool:
    """Whether jemalloc is mapped into process `pid` (Linux; False where /proc cannot be read)."""
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False
    return "libjemalloc" in maps


def preload_env(env: Mapping[str, str], library: str) -> dict[str, str]:
    """`env` with `library` first in LD_PRELOAD and the server's jemalloc settings unless some are set."""
    out = dict(env)
    preload = [p for p in out.get("LD_PRELOAD", "").replace(":", " ").split() if p and p != library]
    out["LD_PRELOAD"] = " ".join([library, *preload])
    out.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    return out


def reexec_library(choice: str, env: Mapping[str, str]) -> tuple[str | None, str]:
    """Whether to re-execute with jemalloc: (its path, why) to do it, (None, why not) to go on as is.

    `choice` is `SWAPCAST_ALLOCATOR`: `system` never; `jemalloc` and `auto` when the library is installed and not
    yet loaded, and this process is not already the re-executed one (the marker: no loop even if the preload
    did not take)."""
    if choice == "system":
        return None, "system allocator asked for"
    if jemalloc_loaded():
        return None, "jemalloc already loaded"
    if env.get(REEXEC_MARKER):
        return None, "jemalloc was preloaded but is not loaded (LD_PRELOAD ignored?); system allocator"
    library = find_jemalloc()
    if library is None:
        return None, f"{JEMALLOC_SONAME} not installed; system allocator"
    return library, f"re-executing with {library}"


def current_allocator() -> str:
    """`jemalloc` or `system`: what this process allocates with."""
    return "jemalloc" if jemalloc_loaded() else "system"


def marker_env(env: Mapping[str, str], library: str) -> dict[str, str]:
    """The environment of the re-executed server: jemalloc preloaded, the marker set."""
    return preload_env(env, library) | {REEXEC_MARKER: "1"}


def exec_with(library: str, argv: list[str], executable: str) -> None:
    """Replace this process with `executable argv[1:]`, jemalloc preloaded (raises OSError if exec fails).
    `argv` is `sys.orig_argv`: the interpreter's own options and `-m module` or the script come back as given.
    The process id stays, so a supervisor or a test holding it follows."""
    os.execve(executable, [executable, *argv[1:]], marker_env(os.environ, library))
