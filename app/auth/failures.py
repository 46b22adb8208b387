"""A growing delay before answering an authentication failure, per client address: guessing keys from one
address gets slower with every miss, while one mistyped key costs its owner a fraction of a second."""

import threading
import time
from collections import OrderedDict, deque

WINDOW_S = 60.0
MAX_ADDRESSES = 10_000


class FailureDelay:
    def __init__(self, per_failure_s: float, max_s: float) -> None:
        self.per_failure_s = per_failure_s
        self.max_s = max_s
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, deque[float]] = OrderedDict()

    def record(self, address: str) -> float:
        """Note a failure from `address`; returns how long to wait before answering it."""
        now = time.monotonic()
        with self._lock:
            times = self._recent.pop(address, None) or deque()
            while times and times[0] < now - WINDOW_S:
                times.popleft()
            times.append(now)
            self._recent[address] = times
            while len(self._recent) > MAX_ADDRESSES:
                self._recent.popitem(last=False)
            count = len(times)
        return min(self.max_s, self.per_failure_s * count)
