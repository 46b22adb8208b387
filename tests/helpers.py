"""Helpers shared across the test packages: image likeness, polling for a condition, and `serve` in a child process."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import numpy as np

from engines.precision import quality

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.05


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    """PSNR in dB of two 8-bit images (the project's measure, `engines.precision.quality`); identical gives +inf."""
    return quality.psnr(a, b, peak=255.0)


def wait_for(condition: Callable[[], bool], within_s: float) -> bool:
    """Whether `condition` holds within `within_s` seconds (asked once more at the end)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(POLL_S)
    return bool(condition())


async def wait_for_async(condition: Callable[[], bool], within_s: float) -> bool:
    """`wait_for` in a coroutine: the event loop runs (and the condition can change) while it waits."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():
            return True
        await asyncio.sleep(POLL_S)
    return bool(condition())


class ServeProcess:
    """`module` (`app.commands.serve` or a wrapper taking its arguments) run with `args` in a child process, with
    the test models; its stdout lines collected as they come, so a test can wait for `ready:` and read the URLs."""

    def __init__(
        self, module: str, args: list[str], model_root: Path, *, stderr: int | IO[str] = subprocess.PIPE, **env: str
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env={**os.environ, "SWAPCAST_MODEL_DIR": str(model_root), "PYTHONPATH": str(REPO), **env},
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("ready:"):
                self.ready.set()

    def wait_ready(self, timeout: float = 90.0) -> ServeProcess:
        assert self.ready.wait(timeout), self.lines
        return self

    @property
    def base_url(self) -> str:
        """The `http://127.0.0.1:PORT` the first line announces."""
        match = re.search(r"http://127\.0\.0\.1:\d+", self.lines[0])
        assert match, self.lines
        return match.group(0)
