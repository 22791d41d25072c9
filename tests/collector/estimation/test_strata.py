"""The fleet's mean over strata of wearers with guarantees of their own
(collector.estimation.strata): weights, the stratified formulas, the bias bound read back
from a history point, and coverage with the collector's own estimator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from collector.aggregation.series import new_series
from collector.api.documents import window_means
from collector.estimation.estimators import Z95, quantile95, student95
from collector.estimation.strata import (
    StratumMean,
    WindowMean,
    fleet_windows,
    stratified_mean,
    stratum_weights,
    window_stratum,
)
from edge_agent import protocol
from edge_agent.mechanisms import linear_mechanism


def coverage_floor(trials: int, level: float = 0.95, alarm: float = 1e-6) -> int:
    """The fewest covering intervals of ``trials`` that a true ``level`` gives but with
    probability ``alarm``."""
    return int(stats.binom.ppf(alarm, trials, level))


def test_each_wearer_weighs_the_same_however_many_strata_it_is_in():
    assert stratum_weights([{"a", "b", "c"}, {"d"}]) == [0.75, 0.25]
    # "c" changed its guarantee: half of it in each stratum
    assert stratum_weights([{"a", "b", "c"}, {"c", "d"}]) == [0.625, 0.375]
    assert stratum_weights([set(), set()]) == [0.0, 0.0]
    assert sum(stratum_weights([{"a"}, {"a", "b"}, {"b", "c", "a"}])) == pytest.approx(1.0)


def test_the_stratified_mean_is_cochrans():
    strata = [StratumMean(0.6, 1.0, 0.1, 0.02, 500), StratumMean(0.4, -1.0, 0.3, 0.05, 40)]
    combined = stratified_mean(strata, low=-2.0, high=2.0)
    variance = (0.6 * 0.1) ** 2 + (0.4 * 0.3) ** 2
    assert combined["estimate"] == pytest.approx(0.6 * 1.0 + 0.4 * -1.0)
    assert combined["stderr"] == pytest.approx(math.sqrt(variance))
    assert combined["bias_bound"] == pytest.approx(0.6 * 0.02 + 0.4 * 0.05)
    degrees = variance**2 / ((0.6 * 0.1) ** 4 / 499 + (0.4 * 0.3) ** 4 / 39)
    half = student95(math.floor(degrees)) * math.sqrt(variance) + combined["bias_bound"]
    assert combined["ci95"] == pytest.approx([0.2 - half, 0.2 + half])
    assert combined["share"] == 1.0


def test_a_stratum_without_an_estimate_leaves_the_mean_to_the_others_and_says_so():
    strata = [StratumMean(0.75, 0.5, 0.01, 0.0, 5000), StratumMean(0.25, math.nan, math.nan,
                                                                   math.nan, 0)]
    combined = stratified_mean(strata, low=0.0, high=1.0)
    assert combined["estimate"] == 0.5 and combined["share"] == 0.75
    assert combined["ci95"] == pytest.approx([0.5 - Z95 * 0.01, 0.5 + Z95 * 0.01])
    assert stratified_mean(strata[1:], low=0.0, high=1.0) is None
    assert stratified_mean([StratumMean(0.0, 0.5, 0.01, 0.0, 10)], low=0.0, high=1.0) is None


def test_the_mean_and_its_interval_stay_in_the_domain():
    combined = stratified_mean([StratumMean(1.0, 1.3, 0.5, 0.0, 10_000)], low=0.0, high=1.0)
    assert combined["estimate"] == 1.0
    assert combined["ci95"] == [pytest.approx(1.0 - Z95 * 0.5), 1.0]
    combined = stratified_mean([StratumMean(1.0, 0.5, 0.5, 0.0, 10_000)], low=0.0, high=1.0)
    assert combined["ci95"] == [0.0, 1.0]


def window_point(mechanism, values, rng):
    """A window's estimates as the collector keeps them (the history point) and as it
    shows them (its full view), from ``values`` reported with ``mechanism``."""
    series = new_series(channel="c", kind="linear", description=protocol.describe(mechanism),
                        bins=50, window_seconds=60.0)
    series.update(agent="a", t=10.0, codes=mechanism.perturb_codes(values, rng))
    series.compute(0)
    series.compute(None)
    return series.points[0][1], series.summary[1]["mean"]


@pytest.mark.parametrize(("name", "epsilon", "centre"), [("pm-c", 1.0, 0.0), ("ogpm", 1.0, 1.7),
                                                         ("ogpm", 4.0, 0.3)])
def test_the_bias_bound_read_back_from_a_point_is_the_estimators(name, epsilon, centre):
    rng = np.random.default_rng([int(epsilon), int(10 * centre)])
    mechanism = linear_mechanism(name, epsilon=epsilon, low=-2.0, high=2.0, grid_bits=16)
    point, view = window_point(mechanism, np.clip(rng.normal(centre, 0.2, 3000), -2, 2), rng)
    assert view["ci95"][0] > -2.0 or view["ci95"][1] < 2.0  # not cut on both sides
    stratum = window_stratum(0.5, window_means([point])[0], low=-2.0, high=2.0)
    assert stratum.bias_bound == pytest.approx(view["bias_bound"], abs=1e-9)
    assert (stratum.estimate, stratum.stderr, stratum.count) == \
        (view["estimate"], view["stderr"], 3000)
    assert quantile95(3000) == Z95


def test_a_stratified_interval_of_the_collectors_estimates_covers_the_wearers_mean():
    """Two strata: 300 wearers at eps 2 around -0.5 and 100 stricter ones at eps 0.5
    around 1.0, a few reports each; the truth is the mean over wearers (each the mean of
    its own readings), which a mean over reports would miss.  (The estimate itself is
    biased here: at eps 0.5 the stricter wearers' 200 reports say little, and the
    estimator of least error draws their mean towards the middle, which its bias bound
    allows for.)"""
    rng = np.random.default_rng(2026)
    study = linear_mechanism("pm-c", epsilon=2.0, low=-2.0, high=2.0, grid_bits=16)
    strict = linear_mechanism("pm-c", epsilon=0.5, low=-2.0, high=2.0, grid_bits=16)
    trials, covered = 120, 0
    for _ in range(trials):
        groups = [(study, rng.normal(-0.5, 0.3, (300, 4))),
                  (strict, rng.normal(1.0, 0.3, (100, 2)))]
        truth = np.mean(np.concatenate([np.clip(v, -2, 2).mean(axis=1) for _, v in groups]))
        weights = stratum_weights([range(300), range(300, 400)])
        strata = []
        for (mechanism, values), weight in zip(groups, weights):
            point, _ = window_point(mechanism, np.clip(values, -2, 2).ravel(), rng)
            strata.append(window_stratum(weight, window_means([point])[0], low=-2.0, high=2.0))
        combined = stratified_mean(strata, low=-2.0, high=2.0)
        covered += combined["ci95"][0] <= truth <= combined["ci95"][1]
        # a mean over reports (300 x 4 against 100 x 2) weighs the stricter wearers 1/7
        assert weights == [0.75, 0.25]
    assert covered >= coverage_floor(trials)


def test_fleet_windows_combine_each_start_of_any_stratum():
    a = [WindowMean(0.0, 60.0, 100, 1.0, 0.1, (1.0 - Z95 * 0.1, 1.0 + Z95 * 0.1)),
         WindowMean(60.0, 120.0, 100, 1.0, 0.1, (1.0 - Z95 * 0.1, 1.0 + Z95 * 0.1))]
    b = [WindowMean(60.0, 120.0, 50, 0.0, 0.2, (-0.5, 0.5)),
         WindowMean(120.0, 180.0, 0, None, None, None)]
    found = fleet_windows([(0.5, a), (0.5, b)], low=-2.0, high=2.0)
    assert [(w["start"], w["end"], w["count"], w["strata"]) for w in found] == \
        [(0.0, 60.0, 100, 1), (60.0, 120.0, 150, 2)]  # no estimate at 120: no window
    assert found[0]["mean"]["estimate"] == 1.0 and found[0]["mean"]["share"] == 0.5
    both = found[1]["mean"]
    assert both["estimate"] == 0.5 and both["share"] == 1.0
    # the bias bound read back from b's interval: 0.5 - t(49) 0.2, halved
    assert both["bias_bound"] == pytest.approx(0.5 * (0.5 - student95(49) * 0.2))
