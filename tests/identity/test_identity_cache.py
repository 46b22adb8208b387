"""IdentityCache: hits and misses, LRU eviction by count and bytes, invalidation, single-flight loads."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from app.identity.cache import IdentityCache, default_size_of

WAIT = 10.0


class Loader:
    """Builds a distinct array per key (filled with a per-call serial) and counts calls per key."""

    def __init__(self, nbytes: int = 100) -> None:
        self.nbytes = nbytes
        self.calls: Counter[tuple[str, str]] = Counter()
        self.lock = threading.Lock()

    def __call__(self, identity_id: str, model_key: str) -> np.ndarray:
        with self.lock:
            self.calls[(identity_id, model_key)] += 1
            serial = sum(self.calls.values())
        return np.full(self.nbytes, serial % 256, dtype=np.uint8)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def sample(registry: CollectorRegistry, name: str, cache: str = "identity") -> float:
    value = registry.get_sample_value(name, {"cache": cache})
    assert value is not None, f"no sample {name}"
    return value


def run_threads(n: int, target: Any) -> list[threading.Thread]:
    threads = [threading.Thread(target=target) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


def test_miss_loads_then_hits(registry: CollectorRegistry) -> None:
    loader = Loader()
    cache: IdentityCache[np.ndarray] = IdentityCache(loader, registry=registry)
    first = cache.get("alice", "swap-v1")
    assert cache.get("alice", "swap-v1") is first
    other_model = cache.get("alice", "swap-v2")
    assert other_model is not first
    assert loader.calls == {("alice", "swap-v1"): 1, ("alice", "swap-v2"): 1}
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.loads, stats.items, stats.bytes) == (1, 2, 2, 2, 200)
    assert ("alice", "swap-v1") in cache and len(cache) == 2
    assert sample(registry, "swapcast_identity_cache_hits_total") == 1
    assert sample(registry, "swapcast_identity_cache_misses_total") == 2
    assert sample(registry, "swapcast_identity_cache_loads_total") == 2
    assert sample(registry, "swapcast_identity_cache_items") == 2
    assert sample(registry, "swapcast_identity_cache_bytes") == 200


def test_evicts_least_recently_used_by_count(registry: CollectorRegistry) -> None:
    loader = Loader()
    cache: IdentityCache[np.ndarray] = IdentityCache(loader, max_items=2, registry=registry)
    cache.get("a", "m")
    cache.get("b", "m")
    cache.get("a", "m")  # a is now the most recently used
    cache.get("c", "m")  # evicts b
    assert cache.keys() == [("a", "m"), ("c", "m")]
    cache.get("b", "m")  # loads b again, evicting a
    assert loader.calls[("b", "m")] == 2
    assert cache.keys() == [("c", "m"), ("b", "m")]
    assert cache.stats().evictions == 2
    assert sample(registry, "swapcast_identity_cache_evictions_total") == 2


def test_evicts_by_bytes(registry: CollectorRegistry) -> None:
    loader = Loader(nbytes=1000)
    cache: IdentityCache[np.ndarray] = IdentityCache(loader, max_items=100, max_bytes=2500, registry=registry)
    cache.get("a", "m")
    cache.get("b", "m")
    assert cache.nbytes == 2000
    cache.get("c", "m")  # 3000 bytes would not fit: a goes
    assert cache.keys() == [("b", "m"), ("c", "m")]
    assert cache.nbytes == 2000
    assert sample(registry, "swapcast_identity_cache_bytes") == 2000

    # A value larger than the whole budget is handed out but not cached, and evicts nothing.
    big = np.zeros(3000, dtype=np.uint8)
    cache.put("huge", "m", big)
    assert ("huge", "m") not in cache
    assert cache.keys() == [("b", "m"), ("c", "m")]
    assert cache.stats().evictions == 1


def test_custom_size_of_and_replacing_an_entry(registry: CollectorRegistry) -> None:
    cache: IdentityCache[str] = IdentityCache(lambda i, m: f"{i}/{m}", max_bytes=10, size_of=len, registry=registry)
    assert cache.get("ab", "cd") == "ab/cd"
    assert cache.nbytes == 5
    cache.put("ab", "cd", "xyz")
    assert cache.get("ab", "cd") == "xyz"
    assert cache.nbytes == 3
    cache.put("q", "r", "1234567")  # 3 + 7 = 10 fits exactly
    assert len(cache) == 2 and cache.nbytes == 10
    cache.put("s", "t", "z")  # 11 would not: the oldest goes
    assert cache.keys() == [("q", "r"), ("s", "t")]
    assert cache.nbytes == 8


def test_default_size_of() -> None:
    assert default_size_of(np.zeros((4, 8), dtype=np.float32)) == 128
    assert default_size_of("no nbytes here") == 0


def test_invalidate_identity_removes_all_its_models(registry: CollectorRegistry) -> None:
    loader = Loader()
    cache: IdentityCache[np.ndarray] = IdentityCache(loader, registry=registry)
    for ident in ("alice", "bob"):
        for model in ("swap-v1", "swap-v2"):
            cache.get(ident, model)
    assert cache.invalidate("alice") == 2
    assert cache.keys() == [("bob", "swap-v1"), ("bob", "swap-v2")]
    assert cache.nbytes == 200
    assert sample(registry, "swapcast_identity_cache_items") == 2
    cache.get("alice", "swap-v1")
    assert loader.calls[("alice", "swap-v1")] == 2
    assert cache.invalidate("nobody") == 0


def test_invalidate_model_removes_it_for_every_identity(registry: CollectorRegistry) -> None:
    loader = Loader()
    cache: IdentityCache[np.ndarray] = IdentityCache(loader, registry=registry)
    for ident in ("alice", "bob", "carol"):
        for model in ("swap-v1", "swap-v2"):
            cache.get(ident, model)
    assert cache.invalidate_model("swap-v1") == 3
    assert cache.keys() == [("alice", "swap-v2"), ("bob", "swap-v2"), ("carol", "swap-v2")]
    cache.get("bob", "swap-v1")
    assert loader.calls[("bob", "swap-v1")] == 2
    assert cache.clear() == 4
    assert len(cache) == 0 and cache.nbytes == 0


def test_concurrent_misses_call_the_loader_once(registry: CollectorRegistry) -> None:
    calls = 0
    calls_lock = threading.Lock()
    release = threading.Event()

    def slow_loader(identity_id: str, model_key: str) -> np.ndarray:
        nonlocal calls
        with calls_lock:
            calls += 1
        assert release.wait(WAIT)
        return np.arange(10)

    cache: IdentityCache[np.ndarray] = IdentityCache(slow_loader, registry=registry)
    barrier = threading.Barrier(16)
    results: list[np.ndarray] = []
    results_lock = threading.Lock()

    def worker() -> None:
        barrier.wait(WAIT)
        value = cache.get("alice", "swap-v1")
        with results_lock:
            results.append(value)

    threads = run_threads(16, worker)
    # Keep the load running long enough for the others to arrive while it is in flight.
    time.sleep(0.3)
    release.set()
    for t in threads:
        t.join(WAIT)
    assert len(results) == 16
    assert calls == 1
    assert all(r is results[0] for r in results)
    stats = cache.stats()
    assert stats.loads == 1
    assert stats.hits + stats.misses == 16


def test_loader_error_reaches_every_waiter_and_is_not_cached(registry: CollectorRegistry) -> None:
    attempts = 0
    release = threading.Event()

    def flaky_loader(identity_id: str, model_key: str) -> np.ndarray:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            assert release.wait(WAIT)
            raise FileNotFoundError(f"no identity {identity_id}")
        return np.ones(4)

    cache: IdentityCache[np.ndarray] = IdentityCache(flaky_loader, registry=registry)
    barrier = threading.Barrier(16)
    outcomes: list[BaseException | np.ndarray] = []
    lock = threading.Lock()

    def worker() -> None:
        barrier.wait(WAIT)
        try:
            out: BaseException | np.ndarray = cache.get("ghost", "swap-v1")
        except FileNotFoundError as exc:
            out = exc
        with lock:
            outcomes.append(out)

    threads = run_threads(16, worker)
    time.sleep(0.3)
    release.set()
    for t in threads:
        t.join(WAIT)
    errors = [o for o in outcomes if isinstance(o, FileNotFoundError)]
    # Threads that arrived while the failing load ran share its error; any later one loads afresh.
    assert len(outcomes) == 16 and len(errors) >= 1
    assert all(e is errors[0] for e in errors)
    assert "no identity ghost" in str(errors[0])
    assert attempts == 1 + (16 - len(errors) > 0)
    assert cache.stats().load_errors == 1
    assert sample(registry, "swapcast_identity_cache_load_errors_total") == 1

    # Nothing was cached by the failure: the next get loads again and succeeds.
    assert len(cache) == (0 if len(errors) == 16 else 1)
    np.testing.assert_array_equal(cache.get("ghost", "swap-v1"), np.ones(4))
    assert len(cache) == 1


def test_invalidate_during_a_load_keeps_the_result_out_of_the_cache(registry: CollectorRegistry) -> None:
    started = threading.Event()
    release = threading.Event()

    def loader(identity_id: str, model_key: str) -> np.ndarray:
        started.set()
        assert release.wait(WAIT)
        return np.zeros(8)

    cache: IdentityCache[np.ndarray] = IdentityCache(loader, registry=registry)
    got: list[np.ndarray] = []
    t = threading.Thread(target=lambda: got.append(cache.get("alice", "swap-v1")))
    t.start()
    assert started.wait(WAIT)
    cache.invalidate("alice")  # e.g. the identity was deleted while it was being read
    release.set()
    t.join(WAIT)
    assert len(got) == 1  # the caller that asked before the delete still gets its value
    assert len(cache) == 0


def test_invalid_bounds_are_refused() -> None:
    with pytest.raises(ValueError, match="max_items"):
        IdentityCache(lambda i, m: i, max_items=0, registry=CollectorRegistry())
