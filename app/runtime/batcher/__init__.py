"""A dynamic batcher: many callers' small model calls become few large ones.

Each model stage gets one `DynamicBatcher`. Callers on any thread, or on an event loop, hand it
single items; a single worker thread owned by the batcher collects them into batches and calls
`run_batch` once per batch (`worker`). Items wait in a `FairQueue` (`fair_queue`): round-robin across
sessions, bounded, with deadlines. A batch is formed as soon as `max_batch` items wait, or when the
oldest waiting item has waited `max_delay_ms`, or when every session active in the last second already
has an item waiting (nobody else is coming, so waiting would only add latency). A caller that blocks for
its results (`DynamicBatcher.run`) while it is alone (nothing queued or running, no other session active)
runs its batch on its own thread: a lone stream pays no hand-off to the worker and back.

Every outcome is delivered through the returned future (`run` returns or raises it): a result, or one
of the `BatcherError` subclasses (`errors`), or whatever `run_batch` raised.

Counters kept (Prometheus, labelled ``batcher=<name>``, and read back by `stats()`; see `metrics`):

* ``submitted``: every item handed to `submit` (and `submit_many`, `submit_async`);
* ``completed``: items that got a result;
* ``failed``: items whose batch raised or returned the wrong number of results, and items still
  queued when the batcher was closed;
* ``rejected``: items turned away at submit (queue full under ``reject_newest``, or batcher closed);
* ``dropped``: queued items pushed out by newer ones under ``drop_stalest``;
* ``expired``: items whose deadline passed before they were put in a batch;
* ``cancelled``: items whose future was cancelled while they were queued.

Once the queue is empty and nothing is in flight, ``submitted`` equals the sum of the others.
"""

from app.runtime.batcher.errors import (
    BatcherClosedError,
    BatcherError,
    BatchResultError,
    DroppedError,
    ExpiredError,
    QueueFullError,
)
from app.runtime.batcher.fair_queue import FairQueue, QueuePolicy
from app.runtime.batcher.metrics import BatcherStats
from app.runtime.batcher.worker import DynamicBatcher

__all__ = [
    "BatchResultError",
    "BatcherClosedError",
    "BatcherError",
    "BatcherStats",
    "DroppedError",
    "DynamicBatcher",
    "ExpiredError",
    "FairQueue",
    "QueueFullError",
    "QueuePolicy",
]
