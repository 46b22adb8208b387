"""Loss-based rate control of a session's return stream: the loss-based half of Google Congestion Control
(draft-ietf-rmcat-gcc-02, section 6), fed by the receiver reports the client sends.

The receiver's estimate (REMB) is the delay-based half, computed by the client. Alone it let the return stream
overshoot a 1.5 Mbit/s cap for 8 s at 720p: it starts at the band's minimum, which was the cap, and the
retransmissions and keyframes on top of it filled the bottleneck's queue before any estimate came down. Per
report (`fraction_lost`, over the interval since the client's previous one):

- over 10% lost: the rate falls to (1 - 0.5 * loss) of itself, at most once per `DECREASE_INTERVAL_S`;
- 2-10%: the rate holds;
- under 2%: the rate grows by `INCREASE_PER_S` per second since the previous report, up to the estimate (or the
  ceiling before one came).

The target handed to the encoder is the rate less what retransmissions sent in the last `RETRANSMIT_WINDOW_S`
(they share the link with the media), never under the floor nor over the ceiling. Alone, as in GCC, it holds a
rate that loses up to 10% over a cap; the estimate (queueing delay) is what takes it further down.

Our own rather than a library's: aiortc (1.16) implements REMB only, and its sender sets the encoder's rate to
the estimate with no loss-based part and no transport-wide feedback; libwebrtc's GoogCC is not reachable from
Python. This is pure logic on the monotonic clock; app.media.sender_feedback feeds it from aiortc's sender.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

HIGH_LOSS = 0.10  # over this share lost: decrease
LOW_LOSS = 0.02  # under this: increase
INCREASE_PER_S = 0.08  # growth per second of clean reports (GCC: 5-8%)
MAX_INCREASE_STEP_S = 1.0  # a report after a long silence grows the rate by one second's worth at most
DECREASE_INTERVAL_S = 0.3  # GCC: one decrease per 300 ms plus the round trip (a report comes every 0.5-1.5 s)
RETRANSMIT_WINDOW_S = 1.0


@dataclass(frozen=True)
class Decision:
    """What the last report did to the rate, and why."""

    rate_bps: int
    reason: str  # start, estimate, increase, hold, decrease


class LossController:
    """The loss-based rate of one stream between `floor_bps` and `ceiling_bps`, starting at `start_bps`."""

    def __init__(self, start_bps: int, floor_bps: int, ceiling_bps: int) -> None:
        if not 0 < floor_bps <= ceiling_bps:
            raise ValueError(f"floor {floor_bps} and ceiling {ceiling_bps} bps: need 0 < floor <= ceiling")
        self.floor_bps = floor_bps
        self.ceiling_bps = ceiling_bps
        self._rate = float(min(max(start_bps, floor_bps), ceiling_bps))
        self.estimate_bps: int | None = None  # the receiver's estimate (REMB), if one came
        self.reason = "start"
        self.fraction_lost: float | None = None
        self.reports = 0
        self.decreases = 0
        self._last_report: float | None = None
        self._last_decrease: float | None = None
        self._retransmits: deque[tuple[float, int]] = deque()  # (when, bytes)

    @property
    def rate_bps(self) -> int:
        return round(self._rate)

    def _bound(self) -> float:
        """How high the rate may go: the estimate inside the band (the ceiling before one came)."""
        if self.estimate_bps is None:
            return float(self.ceiling_bps)
        return float(min(max(self.estimate_bps, self.floor_bps), self.ceiling_bps))

    def on_estimate(self, bps: int) -> None:
        """The receiver's estimate: the rate never exceeds it (GCC sends at the smaller of the two)."""
        self.estimate_bps = int(bps)
        if self._rate > self._bound():
            self._rate = self._bound()
            self.reason = "estimate"

    def on_report(self, fraction_lost: float, now: float) -> Decision:
        """A receiver report's share of packets lost (0-1) since the previous report."""
        loss = min(max(fraction_lost, 0.0), 1.0)
        since = None if self._last_report is None else now - self._last_report
        self._last_report = now
        self.fraction_lost = loss
        self.reports += 1
        if loss > HIGH_LOSS:
            if self._last_decrease is None or now - self._last_decrease >= DECREASE_INTERVAL_S:
                self._rate = max(float(self.floor_bps), self._rate * (1.0 - 0.5 * loss))
                self._last_decrease = now
                self.decreases += 1
            self.reason = "decrease"
        elif loss >= LOW_LOSS:
            self.reason = "hold"
        else:
            step = min(since, MAX_INCREASE_STEP_S) if since is not None else 0.0
            self._rate = min(self._bound(), max(self._rate, self._rate * (1.0 + INCREASE_PER_S) ** step))
            self.reason = "increase"
        return Decision(self.rate_bps, self.reason)

    def on_retransmitted(self, nbytes: int, now: float) -> None:
        """Bytes the sender retransmitted (answering a NACK): they are taken off the media's share."""
        self._retransmits.append((now, nbytes))

    def retransmit_bps(self, now: float) -> int:
        while self._retransmits and now - self._retransmits[0][0] > RETRANSMIT_WINDOW_S:
            self._retransmits.popleft()
        return round(sum(n for _, n in self._retransmits) * 8 / RETRANSMIT_WINDOW_S)

    def target_bps(self, now: float) -> int:
        """The encoder's rate: the loss-based rate (never over the estimate) less the retransmissions'."""
        rate = min(self._rate, self._bound()) - self.retransmit_bps(now)
        return round(min(max(rate, self.floor_bps), self.ceiling_bps))

    def stats(self, now: float) -> dict[str, Any]:
        return {
            "target_bps": self.target_bps(now),
            "loss_rate_bps": self.rate_bps,
            "reason": self.reason,
            "fraction_lost": None if self.fraction_lost is None else round(self.fraction_lost, 3),
            "estimate_bps": self.estimate_bps,
            "retransmit_bps": self.retransmit_bps(now),
            "reports": self.reports,
            "decreases": self.decreases,
        }
