"""Every command checks its numbers and lists while the command line is parsed: a bad value is one
`swapcast: error: ...` line, exit status 2, and no work started."""

import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import main


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert captured.out == ""
    assert len(lines) == 1 and lines[0].startswith("swapcast: error: "), captured.err
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["bench", "batch", "--seconds", "-1"], "argument --seconds: must be more than 0, got -1"),
        (["bench", "batch", "--seconds", "0"], "argument --seconds: must be more than 0, got 0"),
        (["bench", "batch", "--seconds", "nan"], "argument --seconds: expected a finite number"),
        (["bench", "batch", "--max-delay-ms", "-1"], "argument --max-delay-ms: must not be negative"),
        (["bench", "batch", "--max-batch", "0"], "argument --max-batch: must be at least 1"),
        (["bench", "batch", "--sessions", "1,0"], "argument --sessions: each value must be at least 1"),
        (["bench", "batch", "--networks", " , "], "argument --networks: expected a comma list of names"),
        (["bench", "pipeline", "--faces", "7"], "argument --faces: each value must be between 1 and 6"),
        (["bench", "pipeline", "--frames", "two"], "argument --frames: expected a whole number, got 'two'"),
        (["bench", "engines", "--runs", "0"], "argument --runs: must be at least 1"),
        (["demo", "--frames", "3001"], "argument --frames: must be between 1 and 3000"),
        (["serve", "--port", "70000"], "argument --port: must be between 0 and 65535"),
        (["cam", "--server", "127.0.0.1:8000"], "argument --server: expected a URL such as https://"),
        (["cam", "--server", "http://127.0.0.1", "--size", "641x480"], "argument --size: each side must be even"),
        (["cam", "--server", "http://127.0.0.1", "--size", "wide"], "argument --size: expected a size WxH"),
        (["cam", "--server", "http://127.0.0.1", "--output", "screen"], "argument --output: unknown output 'screen'"),
        (["cam", "--server", "http://127.0.0.1", "--fps", "0"], "argument --fps: must be at least 1"),
        (["serve", "--engine", "deepfake9000"], "argument --engine: invalid choice"),
        (["models", "fetch", "x", "--retries", "-1"], "argument --retries: must not be negative"),
        (["engines", "int8", "x", "--samples", "0"], "argument --samples: must be at least 1"),
        (["engines", "build-trt", "x", "--precision", "fp8"], "argument --precision: invalid choice"),
        (["engines", "prune", "--data", "d", "--out", "o", "--target", "1"], "argument --target: must be between 0"),
        (["engines", "prune", "--data", "d", "--out", "o", "--ratios", "0.5,x"], "comma list of fractions"),
        (["engines", "distill", "--data", "d", "--out", "o", "--alpha", "1.5"], "argument --alpha: must be between"),
        (["engines", "distill", "--data", "d", "--out", "o", "--threads", "0"], "argument --threads: must be at least"),
    ],
)
def test_bad_values_are_refused_while_parsing(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in refused(argv, capsys)


def test_swap_source_face_must_not_be_negative(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out.png"
    argv = ["swap", "--source", "a.png", "--target", "b.png", "--output", str(out), "--source-face", "-1"]
    assert "argument --source-face: must not be negative" in refused(argv, capsys)
    assert not out.exists()


def test_bench_batch_with_negative_seconds_exits_2_from_the_console_script() -> None:
    # Its older spelling, as scripts have it; the message names the command as it is now.
    result = subprocess.run(
        [sys.executable, "-m", "app.cli", "bench-batch", "--seconds", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "swapcast: error: argument --seconds: must be more than 0, got -1 (see `swapcast bench batch --help`)"
    ]


def test_a_setting_the_settings_refuse_is_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SWAPCAST_PRECISION", "fp8")
    assert main(["engines", "int8", "retinaface_mnet025", "--recognizer", "auto"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("swapcast: error: invalid setting precision:"), lines
