"""The soak benchmark end to end on a short run (about two minutes): every kind of client joins and leaves in
cycles against one server, and once they have all left the server holds no more tasks, threads, files,
connections or child processes than at its idle baseline; and the figures it reports."""

import json
from pathlib import Path

import pytest

from app.bench.soak_bench import SoakConfig, level, log_errors, run_soak_bench, slope_per_hour
from app.cli import main
from app.commands import bench_soak

KINDS = ("session", "whep", "rtsp_stream", "rtsp_channel")


@pytest.mark.slow
@pytest.mark.alone
def test_a_short_soak_returns_to_its_baseline_once_the_clients_leave(model_root: Path) -> None:
    config = SoakConfig(
        minutes=1.0, hold_s=12.0, pause_s=2.0, window_s=20.0, sample_s=2.0, settle_s=12.0, engine="passthrough"
    )
    result = run_soak_bench(config, progress=False)
    json.dumps(result)
    assert bench_soak.format_table(result).startswith("WINDOW S")
    assert result["errors"] == [], result["errors"]
    assert result["server_log_errors"] == [], result["server_log_errors"]
    assert result["cycles"] >= 3
    ops = result["operations"]
    assert ops["session_join"] == 2 * ops["stream_join"] and ops["whep_join"] == ops["session_join"]
    assert ops["identity_patch"] > 0 and ops["identity_upload"] == ops["identity_delete"] > 0
    for window in result["windows"]:
        for kind in KINDS:
            assert window[kind]["fps"], (kind, window)  # every kind of client got frames in every window
    checks = result["checks"]
    for name, check in checks.items():
        if name.endswith("_back_to_baseline"):
            assert check["ok"], (name, check)
    peaks = {key: r["peak"] for key, r in result["resources"].items()}
    assert peaks["sessions"] == 2 and peaks["streams"] == 1 and peaks["whep_viewers"] == 2, peaks
    assert peaks["rtsp_clients"] >= 2, peaks


def test_growth_is_a_least_squares_slope_per_hour_over_its_window() -> None:
    rows = [{"t": 3600.0 + 60.0 * i, "rss_mb": 100.0 + 0.5 * i} for i in range(20)]
    assert slope_per_hour(rows, "rss_mb", 0.0, 1e9) == 30.0
    assert slope_per_hour(rows, "rss_mb", 3600.0 + 600.0, 1e9) == 30.0
    assert slope_per_hour(rows, "rss_mb", 0.0, 3600.0 + 61.0) is None  # too few samples to fit
    assert level(rows, "rss_mb", 3600.0, 3600.0 + 179.0) == 100.5


def test_errors_are_found_in_the_server_log() -> None:
    log = "INFO:x:fine\nERROR:app.egress.whep:viewer 1: did not close\nTraceback (most recent call last):\n  x\n"
    assert log_errors(log) == ["ERROR:app.egress.whep:viewer 1: did not close", "Traceback (most recent call last):"]
    assert log_errors("WARNING:x:an ERROR in the middle\n") == []


def test_the_command_refuses_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench-soak", "--minutes", "0"])
    assert exited.value.code == 2
    assert "--minutes" in capsys.readouterr().err
    assert main(["bench-soak", "--resolution", "4k"]) == 2
    err = capsys.readouterr().err
    assert "unknown resolution '4k'" in err and "Traceback" not in err
