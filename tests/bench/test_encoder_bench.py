"""`swapcast bench-encoder`: real encodes give sane quality figures; bad arguments are one error line."""

import json
from pathlib import Path

import pytest

from app.cli import main


def test_one_preset_at_480p_gives_quality_time_and_conversions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "encoder.json"
    argv = ["bench-encoder", "--resolutions", "480p", "--presets", "ultrafast", "--threads", "1", "--frames", "30"]
    assert main([*argv, "--output", str(out)]) == 0
    result = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == result
    (row,) = result["rows"]
    assert row["preset"] == "ultrafast" and row["threads"] == 1
    assert 30.0 < row["psnr_db"] < 60.0 and 0.8 < row["ssim"] <= 1.0
    assert 0.5 * row["target_kbps"] < row["kbps"] < 1.5 * row["target_kbps"]
    assert 0 < row["encode_ms"]["p50"] <= row["encode_ms"]["p99"]
    conversion = result["colour_conversion"]["480p"]
    assert conversion["whole_frame_ms"]["p50"] > 0 and conversion["yuv_regions_ms"]["p50"] > 0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench-encoder", "--resolutions", "4k"], "unknown resolution '4k'"),
        (["bench-encoder", "--presets", "placebo"], "preset"),
        (["bench-encoder", "--frames", "10"], "argument --frames: must be between 30 and 3000"),
        (["bench-encoder", "--output", "/no/such/dir/out.json"], "output directory does not exist"),
        (["bench", "--resolutions", "4k"], "unknown resolution '4k'"),
        (["bench", "--output", "/no/such/dir/out.json"], "output directory does not exist"),
    ],
)
def test_bad_arguments_are_one_error_line(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    try:
        status = main(argv)
    except SystemExit as exited:  # argparse refuses while parsing; the command itself returns its status
        status = exited.code
    assert status not in (0, None)
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("swapcast: error: ") and message in err[0], err
