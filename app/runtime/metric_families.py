"""Metric families shared per Prometheus registry.

prometheus-client refuses to register a metric name twice in one registry, yet every batcher (and every
cache) of a process reports under the same names with its own label. So each registry holds one set of
families per kind, made on first use, and each instance takes labelled children from it.
"""

import threading
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry

F = TypeVar("F")

_lock = threading.Lock()
_families: weakref.WeakKeyDictionary[CollectorRegistry, dict[Callable[..., Any], Any]] = weakref.WeakKeyDictionary()


def families_for(registry: CollectorRegistry | None, make: Callable[[CollectorRegistry], F]) -> F:
    """The families `make` builds for `registry` (the default registry when None), built once."""
    target = REGISTRY if registry is None else registry
    with _lock:
        per_kind = _families.setdefault(target, {})
        if make not in per_kind:
            per_kind[make] = make(target)
        made: F = per_kind[make]
        return made
