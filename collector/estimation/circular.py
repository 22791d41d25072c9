"""Circular summaries of perturbed angles: mean direction and mean resultant length, with
standard errors and 95% intervals (no I/O; ``collector.aggregation.blocks.CircularBlock``
calls it).

**Model.**  A circular mechanism is symmetric about its input (docs/guides/FIELD_NOTES.md,
"Circular OGPM"),
so each report's unit vector u = (cos θ', sin θ') has E[u] = ρ(ε)·e^{iθ} for an input θ,
with ρ = ``mechanism.mean_resultant_length()``.  The reports' mean resultant vector
m̄ = (Σcos θ', Σsin θ')/n therefore estimates ρ·μ, μ = R·e^{iθ₀} the readings' mean
resultant vector: its direction is the readings' mean direction θ₀ and its length over ρ
their mean resultant length R.  The readings are treated as a sample of the channel's
readings (independent reports), so the intervals carry both the mechanism's noise and the
readings' own spread.

**Covariance.**  m̄ has covariance Σ/n, Σ the covariance of u.  The sample covariance needs
the second trigonometric moments: with a = θ' − θ̂ (θ̂ the direction of m̄),
Σcos²a = (n + C₂)/2, Σsin²a = (n − C₂)/2, Σcos a·sin a = S₂/2, where C₂ and S₂ are the
sums of cos 2a and sin 2a (``TrigMoments`` keeps Σcos 2θ' and Σsin 2θ', exactly
mergeable).  Along and across θ̂, with the n/(n − 1) of a sample covariance:

    V∥ = (n/(n−1))·((1 + C₂/n)/2 − R̄²),   V⊥ = (n/(n−1))·(1 − C₂/n)/2

(R̄ = |m̄|).  Neither is taken below what the mechanism's own noise gives (law of total
variance; ``covariance``): a small sample of a concentrated channel at large ε can miss
the few reports the mechanism throws anywhere on the circle, and its sample variance
then understates the truth (measured: the length interval covered 76% instead of 95%
at ε = 6, n = 50 without this floor).  The noise's second moment ρ₂ = E cos 2(θ' − x)
comes from the mechanism's exact code probabilities (``noise_second_moment``; for
OGPM it is ((s − 1/s)/2π)·sin(2π/(s + 1)), the k = 2 term of ρ's integral).  Without
the doubled-angle sums (states saved before they existed), ``covariance = "bound"``:
both are bounded by the trace, V∥, V⊥ ≤ tr Σ = 1 − |E u|², estimated
(n/(n−1))(1 − R̄²) (and at least the noise's 1 − ρ²), conservative (wider intervals).

**Mean direction.**  Delta method: se(θ̂) = √(V⊥/n) / R̄.  The interval is
θ̂ ± arcsin(1.96·se), the form of the large-sample (n ≥ 25) interval for a mean
direction in N. I. Fisher (1993), *Statistical Analysis of Circular Data*, ch. 4 (there
se² = (1 − ρ̂₂)/(2nR̄²), ρ̂₂ the mean of cos 2(θ − θ̂), i.e. V⊥ = (1 − ρ̂₂)/2); the arcsin
is what inverting the test "m̄'s component across the candidate direction is zero" gives,
and equals 1.96·se to first order.  It wraps through the channel's origin when it must
(``ci95`` then has low > high).  It is null, "any direction" with a ``reason``, when

* the mean resultant vector cannot be told from zero: its 95% confidence region, the
  ellipse n·m̄ᵀΣ̂⁻¹m̄ ≤ χ²₂(0.95) = −2 ln 0.05, contains the origin (angles too spread,
  or too few, for a direction; a direction interval claiming 95% there would cover the
  truth far less often); or
* 1.96·se ≥ 1: no interval narrower than a half circle.

**Mean resultant length.**  |m̄|² is biased up: E|m̄|² = |E u|² + (1 − |E u|²)/n for
independent reports.  (nR̄² − 1)/(n − 1) is unbiased for |E u|²: it is the pairwise phase
consistency of Vinck et al. (2010), "The pairwise phase consistency: a bias-free measure
of rhythmic neuronal synchronization", NeuroImage 51(1):112-122, mean of
cos(θ'_j − θ'_k) over pairs.  The estimate is √max(0, that)/ρ, **not clipped to 1**:
noise can take it above 1 (a channel whose readings barely move).  Its standard error is
the delta method's √(V∥/n)/ρ.  Its 95% interval inverts the Rice distribution of |m̄|
(S. O. Rice, "Mathematical analysis of random noise", 1944-45; n|m̄|²/V∥ is noncentral
χ² with 2 degrees of freedom when the noise is isotropic), which stays right near 0 where
the delta method's ±1.96·se does not (it covers a small true length ~80% of the time):
with a = the true ρR in standard errors, the acceptance region of a is its Rice quantiles
2.5%-97.5%, and for a ≤ 1 the lower 95% (the usual upper limit of a quantity near zero),
so the interval is never empty.  For |m̄| above 30 standard errors it is the normal
limit.  The interval is then intersected with [0, 1], where R lies (an interval wholly
above 1 becomes [1, 1]).

**Circular standard deviation** √(−2 ln R̂) from the corrected R̂ where 0 < R̂ < 1; null,
with a ``circular_std_reason``, where R̂ ≥ 1 (noise on a concentrated channel: the spread
is below what the reports resolve; the resultant length's interval bounds it) or R̂ = 0.

**Accuracy** (tests/collector/estimation/test_circular.py, 400 repetitions per case): at ε 0.5, 2
and 6 with n = 50 and 20,000, for readings at one angle and for near-uniform ones, both
intervals cover the truth 93.5-100% of the time.  Known limit: with little noise (large
ε), few reports (n ≲ 200) and readings of moderate spread (von Mises κ 1-2), the length
interval covers about 91-93% (2,000 repetitions at n = 50), since cos(θ − θ₀) is skewed
and only two moments are kept; near zero, the χ² quantiles make both intervals ~0.5%
short at n = 50 (a Hotelling-type small-sample effect).
"""

from __future__ import annotations

import math

import numpy as np
from scipy import special

from collector.estimation.estimators import Z95
from collector.estimation.jsonsafe import finite

# The 0.95 quantile of chi-square with 2 degrees of freedom: -2 ln 0.05.
CHI2_2_95 = -2.0 * math.log(0.05)
# Below this many standard errors of true length, the length's acceptance region is
# one-sided (see the module docstring); above RICE_NORMAL_FROM standard errors of
# observed length, the normal limit of the Rice distribution is used.
RICE_ONE_SIDED_BELOW = 1.0
RICE_NORMAL_FROM = 30.0

NO_REPORTS = "no reports yet"
TOO_FEW = "at least 2 reports are needed"
NOT_FROM_ZERO = ("any direction: the mean resultant vector cannot be told from zero (its 95% "
                 "confidence region contains the origin); the angles are too spread, or too "
                 "few, to give a direction")
HALF_CIRCLE = "any direction: the interval would span half the circle or more"
STD_ABOVE_ONE = ("the resultant length estimate is 1 or more (noise on a concentrated "
                 "channel): the spread is below what the reports resolve")
STD_ZERO = ("the resultant length estimate is 0: the angles are too spread for a circular "
            "standard deviation")
NO_SHRINK = "the mechanism's mean resultant length is 0: its reports carry no direction"


def wrap(value: float, origin: float, period: float) -> float:
    """``value`` on [origin, origin + period)."""
    wrapped = origin + (value - origin) % period
    return origin if wrapped >= origin + period else wrapped  # % can round up to period


def _empty(reason: str) -> dict:
    return {"circular_mean": None,
            "direction": {"stderr": None, "half_width": None, "ci95": None, "reason": reason},
            "resultant_length": {"raw": None, "estimate": None, "stderr": None, "ci95": None},
            "circular_std": None, "circular_std_reason": reason, "covariance": None}


def noise_second_moment(mechanism) -> float:
    """E[cos 2(θ' − x)] of a circular mechanism, ρ₂, from its exact code probabilities
    (the same for every input x)."""
    origin, step = mechanism.grid_values
    x = mechanism.origin + mechanism.period / 2.0
    pmf = mechanism.grid_pmf(np.array([x]))[0]
    angles = (origin + step * np.arange(pmf.size) - x) * (2.0 * math.pi / mechanism.period)
    return float(pmf @ np.cos(2.0 * angles))


def covariance(n: int, resultant: float, direction: float, x2: float | None,
               y2: float | None, rho: float, rho2: float) -> tuple[float, float, float, str]:
    """(V∥, V⊥, their covariance, "sample" or "bound"): the covariance of the reports'
    unit vectors along and across ``direction``; n >= 2.

    Each variance is at least what the mechanism's own noise gives (law of total
    variance): with d = θ' − x, Var(cos d) = (1 + ρ₂)/2 − ρ² along x and
    E sin² d = (1 − ρ₂)/2 across it, mixed by the readings' spread about the mean
    direction (their mean cos 2(x − θ̂), estimated as the reports' over ρ₂).  So rare
    large deviations that a small sample happens not to contain (a concentrated channel
    at large ε: a few percent of reports land anywhere) cannot shrink the interval below
    what the mechanism is known to do."""
    factor = n / (n - 1)
    along_x = max((1.0 + rho2) / 2.0 - rho * rho, 0.0)  # Var(cos d)
    across_x = max((1.0 - rho2) / 2.0, 0.0)  # E[sin^2 d]
    if x2 is None or y2 is None:
        # V∥, V⊥ <= tr Σ = 1 - |E u|^2, itself at least the noise's 1 - rho^2.
        bound = max(factor * (1.0 - resultant * resultant), along_x + across_x)
        return bound, bound, 0.0, "bound"
    c2, s2 = math.cos(2.0 * direction), math.sin(2.0 * direction)
    along2 = (x2 * c2 + y2 * s2) / n  # mean cos 2(θ' - θ̂)
    across2 = (y2 * c2 - x2 * s2) / n  # mean sin 2(θ' - θ̂)
    parallel = factor * ((1.0 + along2) / 2.0 - resultant * resultant)
    perpendicular = factor * (1.0 - along2) / 2.0
    spread = min(max(along2 / rho2, -1.0), 1.0) if rho2 > 1e-9 else None
    if spread is None:  # the readings' spread cannot be told: the smaller floor
        floor_parallel = floor_perpendicular = min(along_x, across_x)
    else:
        mean, half = (along_x + across_x) / 2.0, (along_x - across_x) / 2.0
        floor_parallel, floor_perpendicular = mean + half * spread, mean - half * spread
    return (max(parallel, floor_parallel), max(perpendicular, floor_perpendicular),
            factor * across2 / 2.0, "sample")


def origin_statistic(n: int, resultant: float, parallel: float, perpendicular: float,
                     cross: float) -> float:
    """n·m̄ᵀΣ̂⁻¹m̄ in the frame of m̄ = (R̄, 0): the squared distance of the mean resultant
    vector from zero in standard errors (a pseudo-inverse where Σ̂ is singular: infinite
    if m̄ has a component along which the reports do not vary)."""
    if resultant == 0.0:
        return 0.0
    trace = parallel + perpendicular
    det = parallel * perpendicular - cross * cross
    if det > 1e-12 * trace * trace:
        return n * resultant * resultant * perpendicular / det
    # Rank 1 (or 0): finite only if the one direction that varies is m̄'s own.
    if perpendicular > 1e-12 * trace and trace > 0:
        return math.inf
    return n * resultant * resultant / parallel if parallel > 0 else math.inf


def _rice_length(t: float) -> tuple[float, float]:
    """95% interval of a, the true length in standard errors, from the observed t (the
    Neyman belt of the module docstring)."""
    if t > RICE_NORMAL_FROM:  # |m̄| ≈ a + N(0, 1) + 1/(2a)
        centre = t - 0.5 / t
        return centre - Z95, centre + Z95
    w, a0 = t * t, RICE_ONE_SIDED_BELOW
    # Lower end: the smallest a whose acceptance region holds t.
    if w <= special.chndtrix(0.95, 2, a0 * a0):  # t in a one-sided region (a <= a0)
        low = 0.0 if w <= CHI2_2_95 else math.sqrt(special.chndtrinc(w, 2, 0.95))
    else:
        low = max(a0, math.sqrt(special.chndtrinc(w, 2, 0.975)))
    # Upper end: the largest; a0 where t is below every two-sided region.
    if special.chndtr(w, 2, a0 * a0) < 0.025:
        high = a0
    else:
        high = math.sqrt(special.chndtrinc(w, 2, 0.025))
    return low, high


def summary(n: int, x: float, y: float, x2: float | None, y2: float | None, *, rho: float,
            rho2: float, period: float = 2.0 * math.pi, origin: float = 0.0) -> dict:
    """The API's circular statistics of ``n`` reported angles with the sums ``x`` = Σcos θ',
    ``y`` = Σsin θ', ``x2`` = Σcos 2θ', ``y2`` = Σsin 2θ' (None: unknown, bounded), for a
    mechanism with mean resultant length ``rho`` and noise second moment ``rho2``
    (``noise_second_moment``), in the channel's unit (``period``) on
    [origin, origin + period)."""
    if n == 0:
        return _empty(NO_REPORTS)
    unit = period / (2.0 * math.pi)
    theta = math.atan2(y, x)
    raw = min(math.hypot(x, y) / n, 1.0)  # rounding can exceed 1 by an ulp
    out = _empty(TOO_FEW if n < 2 else NO_SHRINK)
    out["circular_mean"] = finite(wrap(theta * unit, origin, period))
    out["resultant_length"]["raw"] = finite(raw)
    if n < 2 or not rho > 0:
        return out

    # Resultant length: bias-corrected (Vinck et al. 2010), over rho, not clipped.
    squared = max((n * raw * raw - 1.0) / (n - 1), 0.0)
    estimate = math.sqrt(squared) / rho
    parallel, perpendicular, cross, method = covariance(n, raw, theta, x2, y2, rho, rho2)
    out["covariance"] = method
    sigma = math.sqrt(parallel / n)  # standard error of |m̄| along theta
    if sigma > 0:
        low, high = (bound * sigma / rho for bound in _rice_length(raw / sigma))
    else:
        low = high = raw / rho
    low, high = min(max(low, 0.0), 1.0), min(max(high, 0.0), 1.0)
    out["resultant_length"].update(estimate=finite(estimate), stderr=finite(sigma / rho),
                                   ci95=[finite(low), finite(high)])

    # Direction: delta method, Fisher's arcsin interval, null where it cannot be told.
    direction = out["direction"]
    stderr = math.sqrt(perpendicular / n) / raw if raw > 0 else math.inf
    direction["stderr"] = finite(stderr * unit)
    if origin_statistic(n, raw, parallel, perpendicular, cross) <= CHI2_2_95:
        direction["reason"] = NOT_FROM_ZERO
    elif Z95 * stderr >= 1.0:
        direction["reason"] = HALF_CIRCLE
    else:
        half = math.asin(Z95 * stderr) * unit
        direction.update(half_width=finite(half), reason=None,
                         ci95=[finite(wrap(theta * unit - half, origin, period)),
                               finite(wrap(theta * unit + half, origin, period))])

    # Circular standard deviation from the corrected length, where it is one.
    if 0.0 < estimate < 1.0:
        out["circular_std"] = finite(math.sqrt(-2.0 * math.log(estimate)) * unit)
        out["circular_std_reason"] = None
    else:
        out["circular_std_reason"] = STD_ABOVE_ONE if estimate >= 1.0 else STD_ZERO
    return out
