"""Category shares from support counts: Norm-Sub against a slow reference, intervals that
cover at their level, consistency that lowers the error (fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest

from collector.estimation.frequencies import frequency_summary, norm_sub
from edge_agent.mechanisms.categorical import ORACLES, GeneralizedRR, OptimizedLocalHashing


def reference_norm_sub(f):
    """Bisection on the shift c: sum(max(f + c, 0)) is increasing in c."""
    low, high = -1.0 - np.max(f), 1.0 - np.min(f)
    for _ in range(200):
        c = (low + high) / 2
        if np.maximum(f + c, 0).sum() > 1:
            high = c
        else:
            low = c
    return np.maximum(f + (low + high) / 2, 0)


@pytest.mark.parametrize("seed", range(20))
def test_norm_sub_is_the_shift_that_makes_shares(seed):
    rng = np.random.default_rng(seed)
    f = rng.normal(0.1, 0.3, rng.integers(1, 60))
    shares = norm_sub(f)
    assert np.all(shares >= 0) and shares.sum() == pytest.approx(1.0, abs=1e-12)
    assert np.allclose(shares, reference_norm_sub(f), atol=1e-12)
    # the same shift for every kept category
    kept = shares > 0
    assert np.allclose(shares[kept] - f[kept], (shares - f)[kept][0])


def test_norm_sub_leaves_shares_alone_and_refuses_bad_input():
    shares = np.array([0.5, 0.3, 0.2, 0.0])
    assert np.allclose(norm_sub(shares), shares)
    for bad in ([], [[0.5, 0.5]], [0.5, np.nan]):
        with pytest.raises(ValueError):
            norm_sub(bad)


def simulate(oracle, truth, n, trials, seed):
    rng = np.random.default_rng(seed)
    values = np.repeat(np.arange(truth.size), np.round(truth * n).astype(int))
    for _ in range(trials):
        yield frequency_summary(oracle, oracle.support(oracle.perturb(values, rng)),
                                values.size)


@pytest.mark.parametrize("name", ["grr", "olh", "oue"])
def test_95_percent_intervals_cover_the_shares(name):
    truth = np.array([0.35, 0.25, 0.2, 0.12, 0.08])
    oracle = ORACLES[name](epsilon=1.0, categories=truth.size)
    hits = []
    for summary in simulate(oracle, truth, 2000, 400, 1):
        low, high = np.array(summary["ci95"]).T
        hits.append((low <= truth) & (truth <= high))
    coverage = np.mean(hits)
    # 2,000 interval checks: a 95% level lands in [0.925, 0.975] but with probability < 1e-6.
    assert 0.925 < coverage < 0.975, coverage


@pytest.mark.parametrize("name", ["grr", "olh", "oue"])
def test_intervals_cover_the_fleets_shares_when_each_window_holds_a_sample_of_it(name):
    """Population division (the planner): each window hears from a random tenth of a
    fleet of 5,000 at a large epsilon, so which wearers report is most of the error.
    The intervals cover the fleet's shares; the fixed-composition variance alone (what
    they were before) covers them far less often (the test can fail)."""
    rng = np.random.default_rng(7)
    fleet = rng.choice(4, size=5000, p=[0.45, 0.3, 0.15, 0.1])
    truth = np.bincount(fleet, minlength=4) / fleet.size
    oracle = ORACLES[name](epsilon=4.0, categories=4)
    p, q = (float(x) for x in oracle.support_probabilities)
    hits, fixed_hits = [], []
    for _ in range(500):
        sample = fleet[rng.permutation(fleet.size)[:500]]
        counts = oracle.support(oracle.perturb(sample, rng))
        summary = frequency_summary(oracle, counts, sample.size)
        low, high = np.array(summary["ci95"]).T
        hits.append((low <= truth) & (truth <= high))
        estimate = np.array(summary["estimate"])
        fixed = np.sqrt(oracle.variance(np.clip(estimate, 0, 1), sample.size))
        fixed_hits.append(np.abs(estimate - truth) <= 1.96 * fixed)
    # 2,000 checks of a >= 95% level (no finite-population factor: a little above).
    assert 0.93 < np.mean(hits) < 0.99, np.mean(hits)
    # GRR's noise is least at a large epsilon, so sampling is most of its error there.
    assert np.mean(fixed_hits) < (0.7 if name == "grr" else 0.93), np.mean(fixed_hits)


def test_consistent_shares_are_closer_to_the_truth():
    """Many small categories at a small ε: the unbiased estimates scatter below 0 and
    above.  Norm-Sub is the Euclidean projection onto the simplex, so its shares are never
    farther (L2) from true shares than the estimates; here strictly closer in every run,
    and closer in L1 on average."""
    truth = np.r_[0.5, 0.2, np.full(48, 0.3 / 48)]
    oracle = OptimizedLocalHashing(epsilon=1.0, categories=truth.size)
    l1 = []
    for summary in simulate(oracle, truth, 3000, 30, 2):
        raw, consistent = np.array(summary["estimate"]), np.array(summary["shares"])
        assert np.linalg.norm(consistent - truth) < np.linalg.norm(raw - truth)
        l1.append((np.abs(consistent - truth).sum(), np.abs(raw - truth).sum()))
    assert np.mean([c for c, _ in l1]) < 0.5 * np.mean([r for _, r in l1])


def test_an_empty_window_has_no_shares():
    summary = frequency_summary(GeneralizedRR(epsilon=1.0, categories=3), [0, 0, 0], 0)
    assert summary == {"n": 0, "estimate": [None] * 3, "stderr": [None] * 3,
                       "ci95": [None] * 3, "shares": [None] * 3, "cluster_stderr": None}
    with pytest.raises(ValueError, match="n: must be a non-negative integer"):
        frequency_summary(GeneralizedRR(epsilon=1.0, categories=3), [0, 0, 0], -1)
