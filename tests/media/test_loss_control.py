"""The loss-based rate control's decisions: sequences of receiver reports -> rates, inside the floor, the ceiling
and the receiver's estimate."""

import pytest

from app.media.loss_control import LossController

FLOOR, START, CEILING = 750_000, 1_500_000, 6_000_000


def controller() -> LossController:
    return LossController(START, FLOOR, CEILING)


def test_heavy_loss_cuts_the_rate_by_half_the_share_lost() -> None:
    control = controller()
    decision = control.on_report(0.20, now=1.0)
    assert decision.reason == "decrease" and decision.rate_bps == round(START * 0.9)
    assert control.on_report(0.40, now=2.0).rate_bps == round(START * 0.9 * 0.8)
    assert control.decreases == 2


def test_moderate_loss_holds_the_rate() -> None:
    control = controller()
    for t, loss in enumerate((0.02, 0.05, 0.10), 1):
        assert control.on_report(loss, now=float(t)).rate_bps == START
    assert control.reason == "hold"


def test_little_loss_raises_the_rate_by_at_most_eight_percent_a_second() -> None:
    control = controller()
    control.on_report(0.0, now=0.0)  # the first report has no interval before it: no change
    assert control.rate_bps == START
    assert control.on_report(0.01, now=0.5).rate_bps == round(START * 1.08**0.5)
    after_silence = control.on_report(0.0, now=10.5).rate_bps  # ten silent seconds count as one
    assert after_silence == pytest.approx(START * 1.08**1.5, abs=1)
    assert control.reason == "increase"


def test_the_rate_never_rises_over_the_receivers_estimate_nor_the_ceiling() -> None:
    control = controller()
    control.on_estimate(1_600_000)
    for t in range(1, 20):
        control.on_report(0.0, now=float(t))
    assert control.rate_bps == 1_600_000 and control.target_bps(20.0) == 1_600_000
    control.on_estimate(1_000_000)  # the estimate falls: the rate follows at once
    assert control.rate_bps == 1_000_000 and control.reason == "estimate"
    control.on_estimate(50_000_000)
    for t in range(20, 60):
        control.on_report(0.0, now=float(t))
    assert control.rate_bps == CEILING


def test_without_an_estimate_the_rate_grows_to_the_ceiling() -> None:
    control = controller()
    for t in range(40):
        control.on_report(0.0, now=float(t))
    assert control.rate_bps == CEILING


def test_the_rate_never_falls_under_the_floor() -> None:
    control = controller()
    for t in range(30):
        control.on_report(1.0, now=float(t))
    assert control.rate_bps == FLOOR and control.target_bps(30.0) == FLOOR
    control.on_retransmitted(1_000_000, now=30.0)
    assert control.target_bps(30.0) == FLOOR, "retransmissions never take the target under the floor"


def test_decreases_are_at_most_one_per_interval() -> None:
    control = controller()
    control.on_report(0.5, now=1.0)
    control.on_report(0.5, now=1.1)  # a second report within 300 ms: no second cut
    assert control.rate_bps == round(START * 0.75) and control.decreases == 1
    control.on_report(0.5, now=1.5)
    assert control.decreases == 2


def test_retransmissions_of_the_last_second_come_off_the_target() -> None:
    control = controller()
    control.on_retransmitted(25_000, now=10.0)  # 200 kbit in the window
    control.on_retransmitted(12_500, now=10.5)
    assert control.retransmit_bps(10.5) == 300_000
    assert control.target_bps(10.5) == START - 300_000
    assert control.target_bps(11.2) == START - 100_000, "the first has left the window"
    assert control.target_bps(12.0) == START


def test_under_a_cap_the_rate_comes_down_to_where_loss_is_tolerated_within_a_few_reports() -> None:
    """Reports from a link capped at 1 Mbit/s (what is sent over it is lost): within a few reports the rate is
    where at most 10% is lost (GCC's loss-based part holds there; the receiver's estimate, its delay-based
    part, takes it further down) and stays there, never under the floor; once the cap lifts it grows again."""
    control = controller()
    cap = 1_000_000
    rates = []
    for t in range(30):
        sent = control.target_bps(float(t))
        loss = max(0.0, 1 - cap / sent)
        rates.append(control.on_report(loss, now=float(t)).rate_bps)
    settled = next(i for i, rate in enumerate(rates) if rate <= cap / 0.9)
    assert settled <= 4, rates
    assert all(FLOOR <= rate <= cap / 0.9 for rate in rates[settled:]), rates
    for t in range(30, 35):
        control.on_report(0.0, now=float(t))
    assert control.rate_bps >= rates[-1] * 1.08**4, "lifted: the rate grows again"


def test_the_stats_say_what_was_decided_and_why() -> None:
    control = controller()
    assert control.stats(0.0)["reason"] == "start"
    control.on_estimate(2_000_000)
    control.on_report(0.25, now=1.0)
    stats = control.stats(1.0)
    assert stats == {
        "target_bps": round(START * 0.875),
        "loss_rate_bps": round(START * 0.875),
        "reason": "decrease",
        "fraction_lost": 0.25,
        "estimate_bps": 2_000_000,
        "retransmit_bps": 0,
        "reports": 1,
        "decreases": 1,
    }


def test_a_floor_over_the_ceiling_is_refused() -> None:
    with pytest.raises(ValueError, match="need 0 < floor <= ceiling"):
        LossController(START, CEILING + 1, CEILING)
