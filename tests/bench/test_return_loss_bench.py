"""`swapcast bench-return-loss` end to end, CI-sized: one seed, one loss, the aiortc receiver, a second of loss.
The shape of its report and that frames flowed both ways of the switch; no timing is asserted."""

import json

import pytest

from app.cli import main
from app.commands.bench_return_loss import format_table


def test_bench_return_loss_reports_both_recovery_modes_per_receiver_and_loss(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = main(["bench-return-loss", "--loss", "5", "--seeds", "1", "--seconds", "1", "--warmup", "0.5"])
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads(out.out)
    assert report["config"]["losses"] == [0.05] and report["config"]["seeds"] == [1]
    groups = report["groups"]
    assert [(g["receiver"], g["loss"], g["recovery"]) for g in groups] == [
        ("aiortc", 0.05, False),
        ("aiortc", 0.05, True),
    ]
    for group in groups:
        assert group["seeds"] == [1]
        for key in ("longest_freeze_ms", "freezes_over_250ms", "held_behind_hole_ms", "fps", "nacks", "resent"):
            assert len(group[key]) == 1, key
        assert group["fps"][0] > 0, "no frame reached the receiver while the loss was on"
        assert 0 < group["gap_ms"]["p50"] <= group["gap_ms"]["p99"] <= group["longest_freeze_ms"][0]
        assert group["held_behind_hole_ms"][0] is not None, "aiortc's jitter buffer was not watched"
        assert group["lost"]["down"][0] + group["lost"]["up"][0] > 0, "the relay lost nothing"
    on = groups[1]
    assert on["probes"][0] is not None and on["nacks"][0] is not None, "the recovery's counts are missing"
    assert groups[0]["probes"][0] == 0, "with the recovery off the sender never probes"
    assert "RECEIVER" in format_table(report)


def test_bench_return_loss_refuses_an_unknown_receiver_before_any_work(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["bench-return-loss", "--receivers", "firefox"])
    assert exited.value.code == 2
    assert "unknown receiver 'firefox'" in capsys.readouterr().err
