"""How the pipeline reaches its models: directly (one caller, e.g. the file CLI) or through one dynamic
batcher per model shared by every live session. Per-frame work (align, paste-back) never goes through
here: it stays on the calling session's worker."""

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from prometheus_client import CollectorRegistry

from app.pipeline.detect import RetinaFaceDetector
from app.pipeline.enhance import RealEsrganEnhancer
from app.pipeline.swap import SwapEngine, SwapItem
from app.pipeline.types import Face, Image
from app.runtime.batcher import DynamicBatcher, QueuePolicy

T = TypeVar("T")
R = TypeVar("R")


class ModelCalls(Protocol):
    def detect(self, frames: list[Image], session: str) -> list[list[Face]]: ...

    def swap(self, items: list[SwapItem], session: str) -> list[Image]: ...

    def enhance(self, crops: list[Image], session: str) -> list[Image]: ...

    def close(self) -> None: ...


class DirectCalls:
    def __init__(
        self, detector: RetinaFaceDetector, engine: SwapEngine, enhancer: RealEsrganEnhancer | None = None
    ) -> None:
        self.detector, self.engine, self.enhancer = detector, engine, enhancer

    def detect(self, frames: list[Image], session: str) -> list[list[Face]]:
        return self.detector.process(frames)

    def swap(self, items: list[SwapItem], session: str) -> list[Image]:
        return self.engine.process(items)

    def enhance(self, crops: list[Image], session: str) -> list[Image]:
        return self.enhancer.process(crops) if self.enhancer else crops

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class BatchSettings:
    max_batch: int = 8
    max_delay_ms: float = 4.0  # a few ms: the whole frame budget at 30 fps is 33 ms
    max_queue: int = 64
    policy: QueuePolicy = "drop_stalest"
    deadline_ms: float | None = 250.0  # a frame older than this is stale for live video: drop, don't compute


@dataclass(frozen=True)
class BatchPlan:
    detect: BatchSettings = BatchSettings()
    swap: BatchSettings = BatchSettings()
    enhance: BatchSettings = BatchSettings(max_batch=4)


def _gather(batcher: DynamicBatcher[T, R], items: list[T], session: str, deadline_ms: float | None) -> list[R]:
    deadline = time.monotonic() + deadline_ms / 1000.0 if deadline_ms else None
    if not items:
        return []
    futures: list[Future[R]] = batcher.submit_many(items, session=session, deadline=deadline)
    return [future.result() for future in futures]


class BatchedCalls:
    """One DynamicBatcher per model. The detector letterboxes every frame onto the same canvas, so
    frames of any size share a batch and a frame's result does not depend on what it was batched with."""

    def __init__(
        self,
        detector: RetinaFaceDetector,
        engine: SwapEngine,
        enhancer: RealEsrganEnhancer | None = None,
        plan: BatchPlan | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.plan = plan or BatchPlan()
        detector.fixed_canvas = True
        self.batchers: dict[str, DynamicBatcher[Any, Any]] = {}
        self._detect = self._batcher("detect", detector.process, self.plan.detect, registry)
        self._swap = self._batcher("swap", engine.process, self.plan.swap, registry)
        self._enhance = self._batcher("enhance", enhancer.process, self.plan.enhance, registry) if enhancer else None

    def _batcher(
        self, name: str, run: Callable[[list[T]], list[R]], settings: BatchSettings, registry: CollectorRegistry | None
    ) -> DynamicBatcher[T, R]:
        batcher: DynamicBatcher[T, R] = DynamicBatcher(
            name,
            run,
            max_batch=settings.max_batch,
            max_delay_ms=settings.max_delay_ms,
            max_queue=settings.max_queue,
            policy=settings.policy,
            registry=registry,
        )
        self.batchers[name] = batcher
        return batcher

    def detect(self, frames: list[Image], session: str) -> list[list[Face]]:
        return _gather(self._detect, frames, session, self.plan.detect.deadline_ms)

    def swap(self, items: list[SwapItem], session: str) -> list[Image]:
        return _gather(self._swap, items, session, self.plan.swap.deadline_ms)

    def enhance(self, crops: list[Image], session: str) -> list[Image]:
        if self._enhance is None:
            return crops
        return _gather(self._enhance, crops, session, self.plan.enhance.deadline_ms)

    def close(self) -> None:
        for batcher in self.batchers.values():
            batcher.close(timeout=5.0)
