"""The content gate of live outputs and files: each session's or stream's input and output checked on a schedule
(one pair every `interval_s`), scored off the frame's path by one batcher shared by every stream, and acted on by
the policy: `blur` covers the whole output until a check finds it clear again, `stop` covers it and ends the
session or stream with a reason. Hits are counted and audited.

A check costs about 75 ms of a core an image, so the gate scores no more than it must: the output only when the
input is clear (a flagged input is acted on either way), and nothing while the picture is unchanged since a check
that scored well clear, for up to `unchanged_s` (app.content.unchanged)."""

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

import cv2
import numpy as np

from app.auth.audit import Audit, no_audit
from app.content.check import ContentCheck, ContentRefused
from app.content.settings import Policy
from app.content.unchanged import look, unchanged
from app.observability import Metrics
from app.pipeline.types import Image
from app.runtime.batcher import DynamicBatcher

log = logging.getLogger(__name__)

SIDES = ("input", "output")
STOP_REASON = "content policy: sexually explicit content"
BLUR_CELLS = 12  # the covered output shows this many blurred cells across its longer side
MAX_BATCH = 8
MAX_QUEUE = 32
# The scoring thread runs at this niceness (Linux schedules threads one by one): a check takes the cores frames
# leave idle, and under full load gets about a tenth of a contended core, so a busy server stretches the
# schedule rather than dropping frames (one pair costs ~150 ms of a core, docs/guides/content-gate.md).
SCORING_NICENESS = 10
# An unchanged picture goes unscored only after a check that scored below this share of the threshold: a score
# near the threshold could cross it on a change too small for the thumbnail to see.
CLEAR_SHARE = 0.5

Pair = tuple[Image, Image]


def lower_priority(niceness: int) -> None:
    """This thread's niceness raised to `niceness` where the system allows it (Linux: per thread)."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, max(niceness, os.getpriority(os.PRIO_PROCESS, tid)))
    except (AttributeError, OSError) as exc:  # no per-thread priorities here: checks run at the frames' priority
        log.debug("content checks keep their priority: %s", exc)


def cover(image: Image) -> Image:
    """The whole frame blurred past recognition: shrunk to a few cells, then smoothly enlarged."""
    height, width = image.shape[:2]
    scale = BLUR_CELLS / max(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    small = cv2.resize(image, size, interpolation=cv2.INTER_AREA)
    return np.asarray(cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC), np.uint8)


class ContentService:
    """What every gate shares: the classifier behind one batcher, the policy, the metrics and the audit log."""

    def __init__(
        self,
        check: ContentCheck,
        policy: Policy,
        interval_s: float,
        metrics: Metrics,
        audit: Audit = no_audit,
        *,
        unchanged_s: float = 0.0,
    ) -> None:
        self.check = check
        self.policy = policy
        self.interval_s = interval_s
        self.unchanged_s = unchanged_s  # 0: every due check is scored, changed or not
        self.metrics = metrics
        self.audit = audit
        self._niced = False
        self.batcher: DynamicBatcher[Pair, tuple[float, ...]] = DynamicBatcher(
            "content",
            self._score,
            max_batch=MAX_BATCH,
            max_delay_ms=5.0,
            max_queue=MAX_QUEUE,
            registry=metrics.registry,
        )

    def _score(self, pairs: list[Pair]) -> list[tuple[float, ...]]:
        """On the batcher's thread: every pair's input, then the outputs of the clear ones; (input,) for a
        flagged input, whose output is acted on either way, else (input, output)."""
        if not self._niced:
            self._niced = True
            lower_priority(SCORING_NICENESS)
        started = time.perf_counter()
        inputs = [float(score) for score in self.check.scores([pair[0] for pair in pairs])]
        clear = [i for i, score in enumerate(inputs) if not self.check.flagged(score)]
        outputs = dict(zip(clear, (float(s) for s in self.check.scores([pairs[i][1] for i in clear])), strict=True))
        self.metrics.content_seconds.labels("live").observe(time.perf_counter() - started)
        return [(score, outputs[i]) if i in outputs else (score,) for i, score in enumerate(inputs)]

    def gate(self, kind: str, ref: str, owner: str, stop: Callable[[str], None]) -> "ContentGate":
        """A gate for one session or stream; `stop(reason)` ends it (called from the batcher's thread once)."""
        return ContentGate(self, kind, ref, owner, stop)

    def judge(self, kind: str, scores: Sequence[float], sides: Sequence[str]) -> list[str]:
        """Count the checks and hits of scored images; return the sides that were flagged."""
        flagged = []
        for score, side in zip(scores, sides, strict=True):
            self.metrics.content_checks.labels(kind, side).inc()
            if self.check.flagged(score):
                self.metrics.content_hits.labels(kind, side).inc()
                flagged.append(side)
        return flagged

    def screen(self, image: Image, kind: str = "upload") -> None:
        """Blocking: score one image now (an uploaded photo); `ContentRefused` when it is flagged."""
        started = time.perf_counter()
        (score,) = self.check.scores([image])
        self.metrics.content_seconds.labels(kind).observe(time.perf_counter() - started)
        if self.judge(kind, [float(score)], ["input"]):
            raise ContentRefused(float(score), self.check.threshold)

    def close(self) -> None:
        self.batcher.close(timeout=2.0)
        self.check.close()


class ContentGate:
    """One session's or stream's schedule and state. `sample` and `apply` run on the frame's worker thread and
    return at once; the scores arrive on the batcher's thread."""

    def __init__(self, service: ContentService, kind: str, ref: str, owner: str, stop: Callable[[str], None]) -> None:
        self._service = service
        self.kind, self.ref, self.owner = kind, ref, owner
        self._stop = stop
        self._lock = threading.Lock()
        self._next_due = 0.0
        self._in_flight = False
        # The check in flight (when it was sampled, and the looks of its input and output), and the last scored one.
        self._sampled_at = 0.0
        self._pending: tuple[float, np.ndarray, np.ndarray] | None = None
        self._last: tuple[float, np.ndarray, np.ndarray] | None = None
        self._last_clear = False  # the last scored check was well below the threshold on both sides
        self.scored = 0  # due checks scored, and skipped because the picture was unchanged
        self.skipped = 0
        self.covered = False  # blur: the output is covered until a check finds it clear
        self.stopped: str | None = None  # stop: why the stream ends (its output stays covered meanwhile)
        self.hits = 0

    def sample(self, image: Image, now: float | None = None) -> Image | None:
        """A copy of the input frame when a check is due (and none is in flight), else None."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._in_flight or now < self._next_due or self.stopped is not None:
                return None
            self._in_flight = True
            self._next_due = now + self._service.interval_s
            self._sampled_at = now
        return np.array(image, copy=True)

    def apply(self, result: Image, sampled: Image | None) -> Image:
        """Send a due check (the sampled input with this output), unless it would repeat the last one, and return
        the output as the policy has it."""
        if sampled is not None:
            self._check(sampled, result)
        if self.stopped is not None:
            return np.zeros_like(result)
        return cover(result) if self.covered else result

    def _check(self, sampled: Image, result: Image) -> None:
        """Skip the due check while the picture is as it was at a recent, well clear one; else submit it."""
        self._pending = None
        if self._service.unchanged_s > 0:
            self._pending = (self._sampled_at, look(sampled), look(result))
            if self._repeats(self._pending):
                with self._lock:
                    self.skipped += 1
                    self._in_flight = False
                return
        self._submit(sampled, np.array(result, copy=True))

    def _repeats(self, pending: tuple[float, np.ndarray, np.ndarray]) -> bool:
        last = self._last
        if last is None or not self._last_clear or self.covered or self.stopped is not None:
            return False
        if pending[0] - last[0] >= self._service.unchanged_s:
            return False
        return unchanged(last[1], pending[1]) and unchanged(last[2], pending[2])

    def _submit(self, sampled: Image, output: Image) -> None:
        try:
            future = self._service.batcher.submit((sampled, output), session=self.ref)
        except Exception as exc:  # closed or full: this check is skipped, the next one comes on schedule
            log.debug("content check of %s %s skipped: %s", self.kind, self.ref, exc)
            self._done()
            return
        future.add_done_callback(self._scored)

    def _done(self) -> None:
        with self._lock:
            self._in_flight = False

    def _scored(self, future: "Future[tuple[float, ...]]") -> None:
        try:
            scores = future.result()
        except Exception as exc:  # skipped under load or failed: the next check comes on schedule
            self._done()
            log.warning("content check of %s %s did not run: %s", self.kind, self.ref, exc)
            return
        # Before the next check may start (`_done`): it compares its picture with this one.
        self.scored += 1
        self._last = self._pending
        self._last_clear = len(scores) == len(SIDES) and max(scores) < CLEAR_SHARE * self._service.check.threshold
        self._done()
        self.observe(scores)

    def observe(self, scores: Sequence[float]) -> None:
        """Act on the scores of one check: (input, output), or (input,) where the input was flagged."""
        service = self._service
        flagged = service.judge(self.kind, scores, SIDES[: len(scores)])
        if not flagged:
            self.covered = False
            return
        self.hits += 1
        first = not self.covered and self.stopped is None
        fields: dict[str, Any] = {"kind": self.kind, "ref": self.ref, "owner": self.owner or None}
        if service.policy == "blur":
            self.covered = True
            if first:
                service.audit("content_flagged", action="blur", sides=flagged, score=round(max(scores), 4), **fields)
            return
        if self.stopped is None:
            self.stopped = STOP_REASON
            service.audit("content_flagged", action="stop", sides=flagged, score=round(max(scores), 4), **fields)
            log.warning("%s %s stopped: %s", self.kind, self.ref, STOP_REASON)
            self._stop(STOP_REASON)

    def describe(self) -> dict[str, Any]:
        return {
            "policy": self._service.policy,
            "covered": self.covered or self.stopped is not None,
            "stopped": self.stopped,
        }
