"""bench-content's live schedule: the gate's own checks on a still and a moving clip, every due check scored
against unchanged pictures skipped."""

from pathlib import Path

from app.bench.content_bench import ContentBenchConfig, live_schedule
from app.content.check import load_content_check
from app.pipeline.types import Image
from engines.store import ModelStore


def test_the_live_schedule_skips_checks_of_a_still_picture_and_none_of_a_moving_one(
    marker_model: Path, store: ModelStore, astronaut: Image
) -> None:
    check = load_content_check(store, threshold=0.8, path=marker_model)
    config = ContentBenchConfig(threshold=0.8, interval_s=1.0, unchanged_s=3.0, stream_s=6)
    try:
        clips = live_schedule(check, config, astronaut)["clips"]
    finally:
        check.close()
    still, moving = clips["still"], clips["moving"]
    assert (still["every_check"]["checks_scored"], still["every_check"]["checks_skipped"]) == (6, 0)
    # Scored at 0 and 3 s (3 s without a check); the still picture's other checks would only repeat the score.
    assert (still["skip_unchanged"]["checks_scored"], still["skip_unchanged"]["checks_skipped"]) == (2, 4)
    assert moving["skip_unchanged"]["checks_scored"] == moving["every_check"]["checks_scored"] == 6
