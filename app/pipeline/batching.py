"""Batching as a wrapper around any stage: `BatchedStage(stage, settings)` is itself a stage whose
`process` hands the items to one dynamic batcher shared by every session, so many streams' small model
calls become few large ones. Per-frame work (align, paste-back) never goes through here: it stays on
the calling session's worker."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Generic

from prometheus_client import CollectorRegistry

from app.pipeline.stage import DEFAULT_SESSION, In, Out, Stage
from app.runtime.batcher import DynamicBatcher, QueuePolicy
from app.settings import BatchingSettings


@dataclass(frozen=True)
class BatchSettings:
    max_batch: int = 8
    max_delay_ms: float = 4.0  # a few ms: the whole frame budget at 30 fps is 33 ms
    max_queue: int = 64
    policy: QueuePolicy = "drop_stalest"
    deadline_ms: float | None = 250.0  # a frame older than this is stale for live video: drop, don't compute

    @classmethod
    def from_settings(cls, settings: BatchingSettings, max_batch: int) -> BatchSettings:
        """One stage's batcher from the `SWAPCAST_BATCH_*` settings (the maximum batch is per stage)."""
        return cls(max_batch, settings.max_delay_ms, settings.max_queue, settings.policy, settings.deadline_ms)


class BatchedStage(Generic[In, Out]):
    """`stage` behind one DynamicBatcher, named `name` (the stage's own name by default; it labels the
    batcher's metrics): callers on any thread submit their
    items under their session and wait for the results. The worker runs `stage.process` one batch at a
    time. Closing stops the batcher (queued items fail) and then closes the wrapped stage."""

    def __init__(
        self,
        stage: Stage[In, Out],
        settings: BatchSettings | None = None,
        registry: CollectorRegistry | None = None,
        *,
        name: str | None = None,
    ) -> None:
        self.stage = stage
        self.settings = settings or BatchSettings()
        self.batcher: DynamicBatcher[In, Out] = DynamicBatcher(
            name or stage.name,
            stage.process,
            max_batch=self.settings.max_batch,
            max_delay_ms=self.settings.max_delay_ms,
            max_queue=self.settings.max_queue,
            policy=self.settings.policy,
            registry=registry,
        )

    @property
    def name(self) -> str:
        return self.batcher.name

    def process(self, batch: list[In], *, session: str = DEFAULT_SESSION) -> list[Out]:
        if not batch:
            return []
        deadline_ms = self.settings.deadline_ms
        deadline = time.monotonic() + deadline_ms / 1000.0 if deadline_ms else None
        return self.batcher.run(batch, session=session, deadline=deadline)

    def close(self) -> None:
        self.batcher.close(timeout=5.0)
        self.stage.close()
