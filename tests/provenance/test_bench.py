"""`swapcast bench-watermark`: real clips through real H.264, JSON with every figure, a PNG of crops."""

from pathlib import Path

import pytest

from app.bench.watermark_bench import Condition, WatermarkBenchConfig, run_watermark_bench
from app.cli import main
from app.media.video_file import read_image


@pytest.mark.slow
def test_bench_reports_robustness_false_positives_cost_and_writes_the_grid(tmp_path: Path) -> None:
    grid = tmp_path / "crops.png"
    config = WatermarkBenchConfig(
        photos=("tom_hanks",), seconds=1, conditions=(Condition("h264_crf23", crf=23),), grid=grid, timing_frames=20
    )
    result = run_watermark_bench(config)
    crf23 = result["conditions"]["h264_crf23"]["per_second"]
    assert crf23["n"] == 1 and crf23["detection_rate"] == 1.0 and crf23["bit_accuracy"] == 1.0
    assert result["psnr_db"]["min"] >= 42.0
    assert result["false_positives"]["unmarked_windows"] == 1 and result["false_positives"]["false_alarms"] == 0
    null = result["false_positives"]["null_statistic_vs_chi2_140"]
    assert null["samples"] == 4 * 64 * 64 and null["decodes_of_unmarked_phases"] == 4 * 100
    assert 0.3 < null["syndrome_bit_share_of_ones"]["min"] <= null["syndrome_bit_share_of_ones"]["max"] < 0.7
    assert 0 < result["cost_cpu_ms_per_720p_frame"]["embed_bgr_ms"] < 50
    assert read_image(grid).shape[1] == 3 * 192 + 8  # unmarked | marked | amplified difference


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--seconds", "0"], "--seconds"), (["--strength", "9"], "--strength"), (["--grid", "x.jpg"], ".png")],
)
def test_bad_arguments_are_one_error_line(args: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench-watermark", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("swapcast: error:") and message in err
