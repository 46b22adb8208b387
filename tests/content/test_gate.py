"""The content gate's decisions through the live core, with the stand-in classifier the tests build: a marked
frame covers the output (blur) or ends the stream (stop), each hit counted and audited, on the schedule."""

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from app.content.check import ContentCheck, load_content_check
from app.content.live import SCORING_NICENESS, STOP_REASON, ContentService
from app.content.settings import Policy
from app.live.core import LiveCore
from app.media.clips import load_sample, sample_faces
from app.observability import Metrics
from app.pipeline.factory import build_pipeline
from app.pipeline.pipeline import FramePipeline
from app.pipeline.timing import StageTimer
from app.pipeline.types import Image
from app.settings import PipelineSettings
from engines.store import ModelStore
from tests.content.marker import marked
from tests.helpers import wait_for


@pytest.fixture(scope="module")
def pipeline(store: ModelStore) -> Iterator[FramePipeline]:
    built = build_pipeline(PipelineSettings(engine="classic", threads=1), store)
    yield built
    built.close()


@pytest.fixture
def check(marker_model: Path, store: ModelStore) -> ContentCheck:
    return load_content_check(store, threshold=0.8, path=marker_model)


def counted(metrics: Metrics, name: str, side: str, kind: str = "stream") -> float:
    return metrics.registry.get_sample_value(f"swapcast_{name}_total", {"kind": kind, "side": side}) or 0.0


def detail(image: Image) -> float:
    """Mean difference between horizontal neighbours: a covered frame has next to none."""
    return float(np.abs(np.diff(image.astype(np.int16), axis=1)).mean())


class Gated:
    """A live core with a gate under `policy`, and what the gate did."""

    def __init__(self, pipeline: FramePipeline, check: ContentCheck, policy: Policy, interval_s: float) -> None:
        self.metrics = Metrics()
        self.events: list[dict[str, Any]] = []
        self.stops: list[str] = []
        self.service = ContentService(check, policy, interval_s, self.metrics, self._audit)
        source = pipeline.prepare_source(load_sample("tom_hanks"))
        self.core = LiveCore(
            kind="stream", name="stream-a", identity_id="tom", source=source, pipeline=pipeline, metrics=self.metrics
        )
        self.core.content = self.service.gate("stream", "a", "alice", self.stops.append)

    def _audit(self, event: str, **fields: Any) -> None:
        self.events.append({"event": event, **fields})

    def checks(self) -> float:
        return counted(self.metrics, "content_checks", "input")

    def frame(self, image: Image, settle: bool = True) -> Image:
        """Process one frame; with `settle`, wait until the check it started (if any) has been scored."""
        before = self.checks()
        out = self.core.process(image, StageTimer())
        if settle:
            wait_for(lambda: self.checks() > before, 10)
        return out

    def close(self) -> None:
        self.core.close()
        self.service.close()


def test_the_stand_in_flags_the_marked_frame_and_no_sample_photo(check: ContentCheck) -> None:
    photos = [load_sample(name) for name in sorted(sample_faces())]
    white = np.full((240, 320, 3), 255, np.uint8)
    scores = check.scores([*photos, white, marked(photos[0])])
    assert all(not check.flagged(float(s)) for s in scores[:-1]), scores
    assert check.flagged(float(scores[-1])), scores


def test_blur_covers_the_whole_output_until_a_check_finds_it_clear(
    pipeline: FramePipeline, check: ContentCheck, astronaut: Image
) -> None:
    gated = Gated(pipeline, check, "blur", interval_s=0.01)
    try:
        clear = gated.frame(astronaut)
        assert gated.checks() == 1 and counted(gated.metrics, "content_hits", "input") == 0
        assert not gated.core.stats()["content"]["covered"]
        gated.frame(marked(astronaut))  # the check of this frame flags it; its own output was not covered yet
        assert gated.core.stats()["content"]["covered"]
        covered = gated.frame(marked(astronaut))
        assert covered.shape == clear.shape
        assert detail(covered) < 0.2 * detail(clear)  # the whole frame, not a face
        assert counted(gated.metrics, "content_hits", "input") == 2
        gated.frame(astronaut)  # clear again: this check uncovers the next output
        uncovered = gated.frame(astronaut)
        assert not gated.core.stats()["content"]["covered"]
        assert detail(uncovered) > 0.8 * detail(clear)
        assert gated.checks() == 5
        # The outputs of the two flagged inputs were not scored: the input alone decided.
        assert counted(gated.metrics, "content_checks", "output") == 3
        # One audit event per flagged spell, with the score for the operator; never a stop under blur.
        assert [(e["event"], e["action"], e["ref"], e["owner"]) for e in gated.events] == [
            ("content_flagged", "blur", "a", "alice")
        ]
        assert gated.events[0]["score"] >= 0.8 and "input" in gated.events[0]["sides"]
        assert gated.stops == []
    finally:
        gated.close()


def test_stop_ends_the_stream_once_and_covers_its_output_meanwhile(
    pipeline: FramePipeline, check: ContentCheck, astronaut: Image
) -> None:
    gated = Gated(pipeline, check, "stop", interval_s=0.01)
    try:
        gated.frame(marked(astronaut))
        assert gated.stops == [STOP_REASON]
        after = [gated.frame(astronaut, settle=False) for _ in range(3)]
        assert all(not frame.any() for frame in after)  # nothing is shown while the stream ends
        assert gated.stops == [STOP_REASON] and gated.checks() == 1  # no checks after the stop
        assert gated.core.stats()["content"] == {"policy": "stop", "covered": True, "stopped": STOP_REASON}
        assert [(e["event"], e["action"]) for e in gated.events] == [("content_flagged", "stop")]
    finally:
        gated.close()


def test_a_stream_is_checked_once_per_interval(pipeline: FramePipeline, check: ContentCheck, t1: Image) -> None:
    gated = Gated(pipeline, check, "stop", interval_s=1.0)
    gate = gated.core.content
    assert gate is not None
    try:
        sampled = gate.sample(t1, now=0.0)
        assert sampled is not None
        assert gate.sample(t1, now=0.1) is None  # one check in flight at a time
        gate.apply(t1, sampled)
        assert wait_for(lambda: gated.checks() == 1, 10)
        assert [gate.sample(t1, now=t) is not None for t in (0.5, 0.99, 1.01)] == [False, False, True]
    finally:
        gated.close()


def test_checks_run_at_a_lower_priority_than_frames(pipeline: FramePipeline, check: ContentCheck, t1: Image) -> None:
    gated = Gated(pipeline, check, "blur", interval_s=0.01)
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    try:
        gated.frame(t1)
        assert gated.checks() == 1
        worker = gated.service.batcher.worker.native_id
        assert worker is not None
        assert os.getpriority(os.PRIO_PROCESS, worker) >= SCORING_NICENESS
        assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the frame's thread keeps its own
    finally:
        gated.close()


def test_the_output_is_scored_only_when_the_input_is_clear(check: ContentCheck, t1: Image) -> None:
    metrics = Metrics()
    service = ContentService(check, "blur", 1.0, metrics)
    try:
        assert len(service.batcher.submit((t1, marked(t1)), session="a").result(10)) == 2
        assert len(service.batcher.submit((marked(t1), t1), session="a").result(10)) == 1
        both = service.batcher.run([(marked(t1), t1), (t1, t1)], session="a")
        assert [len(scores) for scores in both] == [1, 2]
    finally:
        service.close()


def test_an_unchanged_clear_picture_is_scored_again_only_after_unchanged_s_and_a_change_at_once(
    check: ContentCheck, t1: Image
) -> None:
    metrics = Metrics()
    stops: list[str] = []
    service = ContentService(check, "stop", 1.0, metrics, unchanged_s=3.0)
    gate = service.gate("stream", "a", "alice", stops.append)
    noisy = np.random.default_rng(0)

    def check_at(now: float, image: Image) -> None:
        before = gate.scored + gate.skipped
        grain = noisy.normal(0.0, 2.0, image.shape)  # a camera's noise is no change
        frame = np.clip(image + grain, 0, 255).astype(np.uint8)
        sampled = gate.sample(frame, now=now)
        assert sampled is not None
        gate.apply(frame, sampled)
        assert wait_for(lambda: gate.scored + gate.skipped > before, 10)

    try:
        for now in (0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0):
            check_at(now, t1)
        # Scored at 0 and 3 s (3 s without a check), 6 s; the same picture in between only repeats its score.
        assert (gate.scored, gate.skipped) == (3, 4)
        assert counted(metrics, "content_checks", "input") == 3
        check_at(7.0, t1[:, ::-1].copy())  # a changed picture is scored at its first due check
        check_at(8.0, marked(t1))
        assert (gate.scored, gate.skipped) == (5, 4)
        assert stops == [STOP_REASON]
    finally:
        service.close()


def test_every_due_check_is_scored_where_unchanged_s_is_zero(check: ContentCheck, t1: Image) -> None:
    service = ContentService(check, "blur", 1.0, Metrics(), unchanged_s=0.0)
    gate = service.gate("stream", "a", "alice", lambda reason: None)
    try:
        for n in range(3):
            sampled = gate.sample(t1, now=float(n))
            assert sampled is not None
            gate.apply(t1, sampled)
            assert wait_for(lambda n=n: gate.scored == n + 1, 10)
        assert gate.skipped == 0
    finally:
        service.close()
