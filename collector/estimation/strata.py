"""The fleet's mean when its wearers report under different guarantees.

A wearer may state a stronger guarantee than the study's (personalized w-event privacy,
PBD/PBA-style, PVLDB 2025): its agent plans its own ε per report, so its reports form a
series of their own, and each series estimates the mean of its own wearers' readings
(``estimators.linear_estimates``).  The fleet's mean is then a stratified mean, each
series a stratum weighed by its share of the fleet's wearers, not by its reports or its
precision: the stricter wearers' readings may differ from the others', and weighting by
inverse variance would give them the little weight their noise earns and bias the mean
towards everyone else (Cochran, Sampling Techniques, 3rd ed., §5.3: the stratified mean
and its variance, sum of W_h**2 s_h**2; §5.4 for Satterthwaite's degrees of freedom).

The math here does no I/O: ``collector.api.documents`` gives it the series' estimates.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from collector.estimation.estimators import Z95, quantile95


@dataclass(frozen=True)
class StratumMean:
    """One series' mean: its share of the wearers (``weight``), its estimate with the
    standard error and bias bound its estimator gives, and the reports it is of."""

    weight: float
    estimate: float
    stderr: float
    bias_bound: float
    count: int


def stratum_weights(agents: Sequence[Iterable[str]]) -> list[float]:
    """Each stratum's share of the wearers, from the agents each has heard: an agent heard
    in k strata (one that changed its guarantee, or a range discovery its domain) counts
    1/k in each, so that no wearer weighs more than another, however many series it
    starts."""
    sets = [frozenset(group) for group in agents]
    strata_of = Counter(agent for group in sets for agent in group)
    wearers = len(strata_of)
    if wearers == 0:
        return [0.0] * len(sets)
    return [sum(1.0 / strata_of[agent] for agent in group) / wearers for group in sets]


@dataclass(frozen=True)
class WindowMean:
    """One stratum's window as the collector keeps it (a history point, ``LinearPoint``):
    its time, its count, and the mean's estimate, standard error and interval (not its
    bias bound)."""

    start: float
    end: float
    count: int
    estimate: float | None
    stderr: float | None
    ci95: tuple[float, float] | None


def window_stratum(weight: float, window: WindowMean, *, low: float, high: float) \
        -> StratumMean:
    """A window's stratum.  Its bias bound is read back from its interval: the estimator's
    is estimate +- (t s + b) cut to [low, high] (``estimators.linear_estimates``, t for the
    window's count), so b is its wider side's half less t s; where both sides are cut,
    the whole width."""
    if window.estimate is None or window.stderr is None or window.ci95 is None:
        return StratumMean(weight, math.nan, math.nan, math.nan, window.count)
    lo, hi = window.ci95
    if lo <= low and hi >= high:
        bias = high - low
    else:
        bias = max(0.0, max(window.estimate - lo, hi - window.estimate)
                   - quantile95(window.count) * window.stderr)
    return StratumMean(weight, window.estimate, window.stderr, bias, window.count)


def fleet_windows(strata: Sequence[tuple[float, Iterable[WindowMean]]], *, low: float,
                  high: float) -> list[dict]:
    """The fleet's mean of each window any stratum has, oldest first, from the strata's
    (weight, windows): ``start``, ``end``, ``count`` (all strata's), ``strata`` (how many
    have the window) and ``mean`` (``stratified_mean``)."""
    by_start: dict[float, list[tuple[float, WindowMean]]] = {}
    for weight, windows in strata:
        for window in windows:
            by_start.setdefault(window.start, []).append((weight, window))
    found = []
    for start in sorted(by_start):
        present = by_start[start]
        mean = stratified_mean([window_stratum(weight, window, low=low, high=high)
                                for weight, window in present], low=low, high=high)
        if mean is not None:
            found.append({"start": start, "end": present[0][1].end,
                          "count": sum(window.count for _, window in present),
                          "strata": len(present), "mean": mean})
    return found


def stratified_mean(strata: Sequence[StratumMean], *, low: float, high: float) -> dict | None:
    """The fleet's mean of ``strata`` (None if none has a weight and an estimate), kept in
    [low, high] (each stratum's mean too):

    * ``estimate``: sum of W_h m_h, the weights of the strata present made to sum to 1;
    * ``stderr``: sqrt(sum of W_h**2 s_h**2) (the strata's reports are independent);
    * ``bias_bound``: sum of W_h b_h, each stratum's bound on its estimate's bias;
    * ``ci95``: estimate +- (t s + bias_bound), t Student's 97.5% quantile at
      Satterthwaite's degrees of freedom, (sum v_h)**2 / sum v_h**2 / (n_h - 1) with
      v_h = W_h**2 s_h**2 (a stratum of few reports widens it as it widens its own);
    * ``share``: the share of the wearers whose strata are present (below 1 where a
      stratum has no estimate, e.g. no reports in a window: the mean is then of the
      others' wearers only).
    """
    present = [s for s in strata if s.weight > 0 and math.isfinite(s.estimate)
               and math.isfinite(s.stderr) and math.isfinite(s.bias_bound) and s.count > 0]
    share = sum(s.weight for s in present)
    if share <= 0:
        return None
    weights = [s.weight / share for s in present]
    # Each stratum's mean kept in [low, high] too: a sender's own series may state any
    # domain, and must move the fleet's mean no more than one wearer of the domain can.
    estimate = sum(w * min(max(s.estimate, low), high) for w, s in zip(weights, present))
    parts = [(w * s.stderr) ** 2 for w, s in zip(weights, present)]
    variance = sum(parts)
    bias = sum(w * s.bias_bound for w, s in zip(weights, present))
    quantile = Z95
    if variance > 0:
        spread = sum(v * v / (s.count - 1) if s.count > 1 else math.inf
                     for v, s in zip(parts, present) if v > 0)
        degrees = variance * variance / spread if spread > 0 else math.inf
        if math.isfinite(degrees):  # quantile95 takes a count of reports: degrees + 1
            quantile = quantile95(max(1, math.floor(degrees)) + 1)
    stderr = math.sqrt(variance)
    half = quantile * stderr + bias
    return {"estimate": estimate, "stderr": stderr, "bias_bound": bias,
            "ci95": [max(low, estimate - half), min(high, estimate + half)],
            "share": min(share, 1.0)}
