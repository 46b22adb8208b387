"""The identity quota: the check and the creation are one step, so parallel uploads cannot overshoot it."""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from app.identity.quota import IdentityQuota, QuotaExceeded, Usage


def test_parallel_creations_stop_at_the_count() -> None:
    quota = IdentityQuota(max_count=3, max_bytes=10_000)
    stored: list[int] = []
    guard = threading.Lock()

    def create(n: int) -> int:
        time.sleep(0.01)  # a slow store: without the quota's lock every thread would pass the check first
        with guard:
            stored.append(n)
        return n

    def upload(n: int) -> int | None:
        try:
            return quota.create_within(lambda: Usage(len(stored), 0), 100, lambda: create(n))
        except QuotaExceeded as exc:
            assert exc.status == 409
            return None

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(upload, range(8)))
    assert len(stored) == 3 and sum(r is not None for r in results) == 3


def test_the_bytes_an_upload_adds_count() -> None:
    quota = IdentityQuota(max_count=10, max_bytes=1000)
    with pytest.raises(QuotaExceeded, match="600 \\+ 500 bytes") as refused:
        quota.create_within(lambda: Usage(1, 600), 500, lambda: None)
    assert refused.value.status == 413
