"""Chi-square tail probabilities for the detector, in closed form (even degrees of freedom)."""

from __future__ import annotations

import math


def chi2_log_sf(x: float, dof: int) -> float:
    """Natural log of P(X > x) for X ~ chi-square with an even `dof`: exp(-x/2) * sum_{j<dof/2} (x/2)^j / j!,
    summed in log space so that it stays exact far into the tail."""
    if dof <= 0 or dof % 2:
        raise ValueError("dof must be a positive even number")
    if x <= 0:
        return 0.0
    half = x / 2.0
    terms = [j * math.log(half) - math.lgamma(j + 1) for j in range(dof // 2)]
    top = max(terms)
    return -half + top + math.log(sum(math.exp(t - top) for t in terms))


def chi2_isf(p: float, dof: int) -> float:
    """The x with P(X > x) = p, by bisection on the log tail."""
    if not 0 < p < 1:
        raise ValueError("p must be within (0, 1)")
    target = math.log(p)
    lo, hi = 0.0, float(dof)
    while chi2_log_sf(hi, dof) > target:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if chi2_log_sf(mid, dof) > target:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
