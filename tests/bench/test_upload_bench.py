"""`swapcast bench-upload`: the worst accepted photos decode within the memory target, bombs are refused."""

import pytest

from app.bench.upload_bench import run_upload_bench

# The target for any accepted upload, above the process's own size.
DECODE_RSS_TARGET_MB = 200


@pytest.mark.slow
def test_hostile_photos_decode_within_the_memory_target() -> None:
    result = run_upload_bench(16_000_000, names=("png-6300", "png-rgba", "png16", "png-1280"))
    by_name = {row["image"].split("-")[0] + "-" + row["image"].split("-")[1]: row for row in result["images"]}
    assert by_name["png-6300x6300"]["status"] == 413
    assert by_name["png-1280x1"]["status"] == 422
    accepted = [row for row in result["images"] if row["status"] == 200]
    assert len(accepted) == 2
    for row in accepted:
        assert 0 < row["decode_rss_mb"] <= DECODE_RSS_TARGET_MB, row
