"""An in-memory cache of prepared source identities, shared by all sessions.

Entries are keyed by ``(identity_id, model_key)``: the same identity prepared for two swap models
(or two versions of one) is two entries. The cache is bounded by entry count and, optionally, by
total bytes; the least recently used entries are evicted first.

A miss loads the entry with the `loader` (the on-disk identity store). Loads are single-flight:
while one thread loads a key, other threads asking for the same key wait for that load instead of
starting their own. If the loader raises, every waiter gets that exception and nothing is cached.

Invalidation during a load (identity deleted, model changed, or an explicit `put`) keeps the
loaded value out of the cache; the callers already waiting on that load still receive it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge

from app.runtime.metric_families import families_for

__all__ = ["IdentityCache", "IdentityCacheStats", "default_size_of"]

P = TypeVar("P")

_Key = tuple[str, str]


def default_size_of(value: object) -> int:
    """The value's ``nbytes`` when it has an integer one (numpy arrays, prepared sources), else 0."""
    nbytes = getattr(value, "nbytes", None)
    return int(nbytes) if isinstance(nbytes, int) else 0


@dataclass(frozen=True)
class IdentityCacheStats:
    hits: int
    misses: int
    loads: int
    load_errors: int
    evictions: int
    items: int
    bytes: int


# The counts `IdentityCacheStats` reports, each also exported as the counter swapcast_identity_cache_<name>.
_COUNTS = {
    "hits": "Lookups answered from the cache.",
    "misses": "Lookups not in the cache (loaded, or waited on a running load).",
    "loads": "Loader calls.",
    "load_errors": "Loader calls that raised.",
    "evictions": "Entries evicted to stay within the count or byte bound.",
}


class _MetricFamilies:
    def __init__(self, registry: CollectorRegistry) -> None:
        label = ["cache"]
        self.counters = {
            what: Counter(f"swapcast_identity_cache_{what}", doc, label, registry=registry)
            for what, doc in _COUNTS.items()
        }
        self.bytes = Gauge("swapcast_identity_cache_bytes", "Bytes held by cached entries.", label, registry=registry)
        self.items = Gauge("swapcast_identity_cache_items", "Entries held.", label, registry=registry)


class _Flight(Generic[P]):
    """One running load that other callers for the same key can wait on."""

    __slots__ = ("done", "error", "stale", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: P | None = None
        self.error: BaseException | None = None
        # Set when the key was invalidated or overwritten while loading: do not cache the result.
        self.stale = False


class _Entry(Generic[P]):
    __slots__ = ("size", "value")

    def __init__(self, value: P, size: int) -> None:
        self.value = value
        self.size = size


class IdentityCache(Generic[P]):
    """Thread-safe LRU cache of prepared identities, bounded by count and by bytes.

    `max_bytes=None` leaves the byte total unbounded. A single value larger than `max_bytes` is
    returned to its caller but never cached.
    """

    def __init__(
        self,
        loader: Callable[[str, str], P],
        *,
        max_items: int = 256,
        max_bytes: int | None = None,
        size_of: Callable[[P], int] | None = None,
        name: str = "identity",
        registry: CollectorRegistry | None = None,
    ) -> None:
        if max_items < 1:
            raise ValueError(f"max_items must be at least 1, got {max_items}")
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must not be negative, got {max_bytes}")
        self._loader = loader
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._size_of: Callable[[P], int] = size_of if size_of is not None else default_size_of
        self._name = name

        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, _Entry[P]] = OrderedDict()
        self._inflight: dict[_Key, _Flight[P]] = {}
        self._bytes = 0
        # This cache's own counts: caches that share a name in one registry share their Prometheus children.
        self._counts = dict.fromkeys(_COUNTS, 0)

        f = families_for(registry, _MetricFamilies)
        self._m_counts = {what: counter.labels(name) for what, counter in f.counters.items()}
        self._m_bytes = f.bytes.labels(name)
        self._m_items = f.items.labels(name)
        self._m_bytes.set(0)
        self._m_items.set(0)

    # ----------------------------------------------------------------- public

    @property
    def name(self) -> str:
        return self._name

    @property
    def nbytes(self) -> int:
        """Bytes currently held by cached entries."""
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries

    def keys(self) -> list[tuple[str, str]]:
        """Cached keys, least recently used first."""
        with self._lock:
            return list(self._entries)

    def get(self, identity_id: str, model_key: str) -> P:
        """The prepared identity for this model, loading it on a miss (one load per key at a time)."""
        key = (identity_id, model_key)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self._count_locked("hits")
                return entry.value
            self._count_locked("misses")
            flight = self._inflight.get(key)
            leader = flight is None
            if flight is None:
                flight = self._inflight[key] = _Flight()
                self._count_locked("loads")

        if not leader:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.value  # type: ignore[return-value]

        try:
            value = self._loader(identity_id, model_key)
            size = self._checked_size(value)
        except BaseException as exc:
            with self._lock:
                self._count_locked("load_errors")
                if self._inflight.get(key) is flight:
                    del self._inflight[key]
            flight.error = exc
            flight.done.set()
            raise

        with self._lock:
            if self._inflight.get(key) is flight:
                del self._inflight[key]
            if not flight.stale:
                self._store_locked(key, value, size)
        flight.value = value
        flight.done.set()
        return value

    def put(self, identity_id: str, model_key: str, value: P) -> None:
        """Insert or replace an entry (a load already running for this key will not overwrite it)."""
        key = (identity_id, model_key)
        size = self._checked_size(value)
        with self._lock:
            flight = self._inflight.pop(key, None)
            if flight is not None:
                flight.stale = True
            self._store_locked(key, value, size)

    def invalidate(self, identity_id: str) -> int:
        """Remove every model's entry for this identity (e.g. it was deleted); returns how many."""
        return self._remove_where(lambda key: key[0] == identity_id)

    def invalidate_model(self, model_key: str) -> int:
        """Remove every identity's entry for this model (e.g. the model changed); returns how many."""
        return self._remove_where(lambda key: key[1] == model_key)

    def clear(self) -> int:
        """Remove every entry; returns how many."""
        return self._remove_where(lambda key: True)

    def stats(self) -> IdentityCacheStats:
        with self._lock:
            return IdentityCacheStats(**self._counts, items=len(self._entries), bytes=self._bytes)

    # ---------------------------------------------------------------- private

    def _count_locked(self, what: str, n: int = 1) -> None:
        self._counts[what] += n
        self._m_counts[what].inc(n)

    def _checked_size(self, value: P) -> int:
        size = self._size_of(value)
        if size < 0:
            raise ValueError(f"size_of returned a negative size ({size})")
        return size

    def _store_locked(self, key: _Key, value: P, size: int) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        if self._max_bytes is None or size <= self._max_bytes:
            self._entries[key] = _Entry(value, size)
            self._bytes += size
            evicted = 0
            while len(self._entries) > self._max_items or (
                self._max_bytes is not None and self._bytes > self._max_bytes
            ):
                _, victim = self._entries.popitem(last=False)
                self._bytes -= victim.size
                evicted += 1
            if evicted:
                self._count_locked("evictions", evicted)
        self._update_gauges_locked()

    def _remove_where(self, match: Callable[[_Key], bool]) -> int:
        with self._lock:
            doomed = [key for key in self._entries if match(key)]
            for key in doomed:
                self._bytes -= self._entries.pop(key).size
            for key in [key for key in self._inflight if match(key)]:
                self._inflight.pop(key).stale = True
            self._update_gauges_locked()
            return len(doomed)

    def _update_gauges_locked(self) -> None:
        self._m_bytes.set(self._bytes)
        self._m_items.set(len(self._entries))
