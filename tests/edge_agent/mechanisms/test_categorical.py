"""Categorical frequency oracles (GRR, OUE, OLH): parameters, exact privacy from the
integer weights, kernels against slow references, goodness of fit against the exact
output distribution (false alarm 1e-6), and the estimator's mean and closed-form
variance against simulation."""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from edge_agent.mechanisms._categorical import hash_to, hashed_values
from edge_agent.mechanisms._layout import ratio_within
from edge_agent.mechanisms.categorical import (
    MAX_CATEGORIES,
    MAX_UNARY_CATEGORIES,
    ORACLES,
    TOTAL,
    GeneralizedRR,
    LongitudinalGRR,
    OptimizedLocalHashing,
    OptimizedUnaryEncoding,
    SymmetricUnaryEncoding,
    best_oracle,
    optimal_buckets,
)
from edge_agent.mechanisms.randomness import SeededRandom
from tests.edge_agent.mechanisms.helpers import FALSE_ALARM, dkw_threshold, hockey_stick

EPSILONS = [1e-5, 0.1, 0.5, 1.0, 2.0, 4.0, 8.0, 20.0]
SIZES = [2, 3, 10, 100]
MASK64 = (1 << 64) - 1


# -- parameters ----------------------------------------------------------------------------

@pytest.mark.parametrize("cls", list(ORACLES.values()))
def test_parameters_are_keyword_only_and_validated(cls):
    with pytest.raises(TypeError):
        cls(1.0, 3)
    with pytest.raises(TypeError):
        cls(epsilon="1", categories=3)
    with pytest.raises(TypeError, match="categories must be an integer"):
        cls(epsilon=1.0, categories=2.5)
    with pytest.raises(ValueError, match=r"categories: must be in \[2, "):
        cls(epsilon=1.0, categories=1)
    with pytest.raises(ValueError, match=r"epsilon: must be in \[1e-05, 20\]"):
        cls(epsilon=0.0, categories=3)
    oracle = cls(epsilon=1.0, categories=3)
    with pytest.raises(TypeError, match="integer category numbers"):
        oracle.perturb([0.5, 1.0])
    with pytest.raises(ValueError, match=r"category numbers in \[0, 2\]"):
        oracle.perturb([0, 3])
    assert eval(repr(oracle), {type(oracle).__name__: cls}) == oracle


def test_domain_sizes_are_bounded():
    GeneralizedRR(epsilon=1.0, categories=MAX_CATEGORIES)
    OptimizedUnaryEncoding(epsilon=1.0, categories=MAX_UNARY_CATEGORIES)
    with pytest.raises(ValueError, match=f"categories: must be in \\[2, {MAX_UNARY_CATEGORIES}\\]"):
        OptimizedUnaryEncoding(epsilon=1.0, categories=MAX_UNARY_CATEGORIES + 1)


# -- exact privacy -------------------------------------------------------------------------

def worst_ratio(pmfs) -> Fraction:
    """max over inputs u, v and outputs y of P[y|u] / P[y|v], from exact pmfs."""
    return max(a[y] / b[y] for a, b in itertools.permutations(pmfs, 2) for y in range(len(a)))


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("k", SIZES)
def test_grr_loss_is_the_worst_ratio_of_its_exact_pmf_and_within_epsilon(epsilon, k):
    oracle = GeneralizedRR(epsilon=epsilon, categories=k)
    pmfs = [oracle.pmf(v) for v in range(min(k, 4))]
    assert all(sum(pmf) == 1 for pmf in pmfs)
    assert oracle.exact_privacy_loss().ratio == worst_ratio(pmfs)
    assert oracle.exact_privacy_loss().at_most(epsilon)
    # Tight: one unit less of the other categories' weight would exceed e^epsilon.
    less = oracle.other_weight - 1
    assert not ratio_within(TOTAL - (k - 1) * less, less, epsilon)


def unary_pmf(oracle, value, k):
    p, q = oracle.support_probabilities
    out = []
    for bits in itertools.product((0, 1), repeat=k):
        prob = Fraction(1)
        for j, bit in enumerate(bits):
            one = p if j == value else q
            prob *= one if bit else 1 - one
        out.append(prob)
    return out


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_oue_loss_is_the_worst_ratio_over_every_bit_vector(epsilon):
    oracle = OptimizedUnaryEncoding(epsilon=epsilon, categories=3)
    pmfs = [unary_pmf(oracle, v, 3) for v in range(3)]
    assert all(sum(pmf) == 1 for pmf in pmfs)
    assert oracle.exact_privacy_loss().ratio == worst_ratio(pmfs)
    assert oracle.exact_privacy_loss().at_most(epsilon)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("k", SIZES)
def test_olh_loss_is_grr_over_its_buckets_for_every_seed(epsilon, k):
    """Given the seed (independent of the value), the bucket is GRR of H(v) over g."""
    oracle = OptimizedLocalHashing(epsilon=epsilon, categories=k)
    g = oracle.buckets
    keep, other = Fraction(oracle.keep_weight, TOTAL), Fraction(oracle.other_weight, TOTAL)
    assert keep + (g - 1) * other == 1
    loss = oracle.exact_privacy_loss()
    assert loss.ratio == keep / other and loss.at_most(epsilon)


# -- kernels against slow references -------------------------------------------------------

def reference_grr(values, words, keep, other):
    out = []
    for v, w in zip(values, words):
        r = int(w) >> 11
        if r < keep:
            out.append(v)
        else:
            j = (r - keep) // other
            out.append(j if j < v else j + 1)
    return out


def reference_hash(seed, value, g):
    z = ((int(seed) << 32) ^ int(value)) & MASK64
    z = (z + 0x9E3779B97F4A7C15) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    z ^= z >> 31
    return ((z >> 32) * g) >> 32


@pytest.mark.parametrize("k", [2, 3, 10, 1000])
def test_grr_kernel_matches_the_reference(k):
    oracle = GeneralizedRR(epsilon=0.7, categories=k)
    rng = np.random.default_rng(k)
    values = rng.integers(0, k, 2000)
    words = SeededRandom(np.random.default_rng(1)).words(values.size)
    codes = oracle.perturb(values, np.random.default_rng(1))
    assert codes.tolist() == reference_grr(values.tolist(), words.tolist(), oracle.keep_weight,
                                           oracle.other_weight)


def test_oue_kernel_matches_the_reference():
    oracle = OptimizedUnaryEncoding(epsilon=1.3, categories=7)
    values = np.random.default_rng(2).integers(0, 7, 300)
    words = SeededRandom(np.random.default_rng(3)).words(values.size * 7).reshape(-1, 7)
    bits = oracle.perturb(values, np.random.default_rng(3))
    expected = [[int((int(words[i, j]) >> 11) < (oracle.one_own if j == v else oracle.one_other))
                 for j in range(7)] for i, v in enumerate(values)]
    assert bits.tolist() == expected


def test_olh_hash_and_support_match_the_reference():
    oracle = OptimizedLocalHashing(epsilon=2.0, categories=20)
    g = oracle.buckets
    seeds, codes = oracle.perturb(np.arange(20).repeat(5), np.random.default_rng(4))
    for seed, v in zip(seeds[:50], range(50)):
        assert hash_to(seed, v % 20, g) == reference_hash(seed, v % 20, g)
    expected = [sum(reference_hash(s, v, g) == c for s, c in zip(seeds, codes))
                for v in range(20)]
    assert oracle.support((seeds, codes)).tolist() == expected


# -- goodness of fit -----------------------------------------------------------------------

N = 200_000


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 6.0])
@pytest.mark.parametrize("k", [2, 5, 40])
def test_grr_reports_follow_the_exact_pmf(epsilon, k):
    oracle = GeneralizedRR(epsilon=epsilon, categories=k)
    value = k // 2
    codes = oracle.perturb(np.full(N, value), np.random.default_rng(10 + k))
    cdf = np.cumsum([float(x) for x in oracle.pmf(value)])
    empirical = np.cumsum(np.bincount(codes, minlength=k)) / N
    assert np.max(np.abs(empirical - cdf)) < dkw_threshold(N)


def test_goodness_of_fit_rejects_a_wrong_epsilon():
    wrong = GeneralizedRR(epsilon=2.2, categories=5)
    codes = GeneralizedRR(epsilon=2.0, categories=5).perturb(np.full(N, 2),
                                                             np.random.default_rng(5))
    cdf = np.cumsum([float(x) for x in wrong.pmf(2)])
    empirical = np.cumsum(np.bincount(codes, minlength=5)) / N
    assert np.max(np.abs(empirical - cdf)) > dkw_threshold(N)


@pytest.mark.parametrize("epsilon", [0.5, 3.0])
def test_oue_bits_follow_their_exact_probabilities(epsilon):
    k, n = 6, 100_000
    oracle = OptimizedUnaryEncoding(epsilon=epsilon, categories=k)
    bits = oracle.perturb(np.full(n, 1), np.random.default_rng(6))
    p, q = (float(x) for x in oracle.support_probabilities)
    expected = np.where(np.arange(k) == 1, p, q)
    # Hoeffding for each bit's mean, Bonferroni over the k bits: false alarm 1e-6 in all.
    bound = math.sqrt(math.log(2 * k / FALSE_ALARM) / (2 * n))
    assert np.max(np.abs(bits.mean(axis=0) - expected)) < bound


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 5.0])
def test_olh_buckets_are_grr_of_the_hashed_value(epsilon):
    oracle = OptimizedLocalHashing(epsilon=epsilon, categories=50)
    g = oracle.buckets
    seeds, codes = oracle.perturb(np.full(N, 7), np.random.default_rng(7))
    hashed = np.empty(N, dtype=np.int64)
    hashed_values(seeds, np.full(N, 7, dtype=np.int64), g, hashed)
    offsets = (codes.astype(np.int64) - hashed) % g  # 0: kept; else uniform over g - 1
    keep = oracle.keep_weight / TOTAL
    cdf = keep + np.arange(g) * (1 - keep) / (g - 1)
    empirical = np.cumsum(np.bincount(offsets, minlength=g)) / N
    assert np.max(np.abs(empirical - cdf)) < dkw_threshold(N)


# -- estimation ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(ORACLES))
@pytest.mark.parametrize("epsilon,delta", [(0.5, 0.0), (2.0, 0.0), (1.0, 1e-3), (1.0, 0.05)])
def test_estimates_are_unbiased_with_the_closed_form_variance(name, epsilon, delta):
    k, n, trials = 8, 1_000, 300
    oracle = ORACLES[name](epsilon=epsilon, categories=k, delta=delta)
    truth = np.array([0.4, 0.2, 0.1, 0.1, 0.1, 0.05, 0.05, 0.0])
    rng = np.random.default_rng(8)
    counts = np.round(truth * n).astype(int)
    values = np.repeat(np.arange(k), counts)
    estimates = np.array([oracle.estimate(oracle.support(oracle.perturb(values, rng)), n)
                          for _ in range(trials)])
    variance = oracle.variance(truth, n)
    # The mean of 300 estimates: within 5.3 standard errors (two-sided 1e-7 each, Bonferroni
    # over k: false alarm below 1e-6).
    assert np.all(np.abs(estimates.mean(axis=0) - truth) < 5.3 * np.sqrt(variance / trials))
    # Their variance: the sample variance of 300 near-normal values lies within a factor
    # [0.6, 1.5] of the true one with probability far above 1 - 1e-6 (chi-square, 299 df).
    ratio = estimates.var(axis=0, ddof=1) / variance
    assert np.all((0.6 < ratio) & (ratio < 1.5)), ratio


def test_variance_closed_forms_agree_with_the_papers_formulas():
    """With f -> 0: GRR (e^ε + k - 2) / (e^ε - 1)^2 and OUE/OLH 4 e^ε / (e^ε - 1)^2 (Wang
    et al. 2017, Eqs. 5 and 9), up to the integer weights and OLH's rounded g."""
    for epsilon, k in [(1.0, 5), (2.0, 50), (4.0, 500)]:
        e = math.exp(epsilon)
        grr = GeneralizedRR(epsilon=epsilon, categories=k).variance(0.0, 1)
        assert grr == pytest.approx((e + k - 2) / (e - 1) ** 2, rel=1e-9)
        oue = OptimizedUnaryEncoding(epsilon=epsilon, categories=k).variance(0.0, 1)
        assert oue == pytest.approx(4 * e / (e - 1) ** 2, rel=1e-9)
        olh = OptimizedLocalHashing(epsilon=epsilon, categories=k).variance(0.0, 1)
        assert olh == pytest.approx(4 * e / (e - 1) ** 2, rel=0.05)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("k", [2, 3, 5, 10, 30, 100, 1000])
def test_auto_picks_grr_for_small_domains_and_olh_for_large(epsilon, k):
    choice = best_oracle(epsilon=epsilon, categories=k)
    threshold = 3 * math.exp(epsilon) + 2  # Wang et al. 2017, Sec. 4.5
    if k < threshold - 1:
        assert choice == "grr"
    elif k > threshold + 1:
        assert choice == "olh"


def test_olh_buckets_are_the_optimal_g():
    assert [optimal_buckets(e) for e in (1e-5, 1.0, 2.0, 5.0)] == [2, 4, 8, 149]


# -- (ε,δ): Wang et al. arXiv:1906.01777 Section 5 -------------------------------------------

DELTAS = [1e-6, 1e-3, 0.05]


@pytest.mark.parametrize("delta", DELTAS)
@pytest.mark.parametrize("epsilon", [0.5, 2.0, 5.0])
def test_grr_aldp_delta_is_the_hockey_stick_divergence_and_tight(epsilon, delta):
    k = 4
    oracle = GeneralizedRR(epsilon=epsilon, categories=k, delta=delta)
    exact = hockey_stick([oracle.pmf(v) for v in range(k)], epsilon)
    assert abs(exact - oracle.exact_delta()) < Decimal(10) ** -60
    assert exact <= Decimal(delta)
    worse = GeneralizedRR(epsilon=epsilon, categories=k)  # one unit less for the others
    worse.other_weight = oracle.other_weight - 1
    worse.keep_weight = TOTAL - (k - 1) * worse.other_weight
    assert worse.exact_delta() > Decimal(delta)


@pytest.mark.parametrize("cls", [OptimizedUnaryEncoding, SymmetricUnaryEncoding])
@pytest.mark.parametrize("delta", [0.0, *DELTAS])
@pytest.mark.parametrize("epsilon", [0.5, 2.0, 5.0])
def test_unary_aldp_delta_is_the_hockey_stick_over_every_bit_vector(cls, epsilon, delta):
    oracle = cls(epsilon=epsilon, categories=3, delta=delta)
    exact = hockey_stick([unary_pmf(oracle, v, 3) for v in range(3)], epsilon)
    assert abs(exact - oracle.exact_delta()) < Decimal(10) ** -60
    assert exact <= Decimal(delta)
    if delta == 0:
        assert oracle.exact_privacy_loss().at_most(epsilon)


@pytest.mark.parametrize("delta", DELTAS)
def test_olh_aldp_delta_holds_for_every_seed(delta):
    oracle = OptimizedLocalHashing(epsilon=2.0, categories=50, delta=delta)
    g = oracle.buckets
    keep, other = Fraction(oracle.keep_weight, TOTAL), Fraction(oracle.other_weight, TOTAL)
    pmfs = [[keep if y == x else other for y in range(g)] for x in range(min(g, 3))]
    assert hockey_stick(pmfs, 2.0) <= Decimal(delta)
    assert abs(hockey_stick(pmfs, 2.0) - oracle.exact_delta()) < Decimal(10) ** -60


def paper_variances(epsilon, delta, k, g, q):
    """Wang et al. arXiv:1906.01777 Eqs. 46, 50, 52 and 56, per report (N = 1)."""
    e = math.exp(epsilon)
    root = math.sqrt(e * (1 - delta) + delta)
    return {
        "grr": (e + k - 2 + delta) * (1 - delta) / (e + k * delta - 1) ** 2,
        "oue": q * (1 - q) * (1 - q + q * e) ** 2 / (q * (1 - q) * (e - 1) + delta) ** 2,
        "sue": (root - 1) * (e - root) / (e - 2 * root + 1) ** 2,
        "olh": (e + g - 1) ** 2 / ((g - 1) * (e + g * delta - 1) ** 2),
    }


@pytest.mark.parametrize("delta", [0.0, 1e-6, 1e-3])
@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0, 5.0, 10.0])
@pytest.mark.parametrize("k", [2, 10, 100])
def test_closed_form_variances_are_the_papers_figure_2(epsilon, delta, k):
    """The oracles' variances (exact p, q from the integer weights, f -> 0) are the
    paper's Eqs. 46-56, the curves of its Fig. 2."""
    oracles = {name: ORACLES[name](epsilon=epsilon, categories=k, delta=delta)
               for name in ORACLES}
    q = float(oracles["oue"].support_probabilities[1])
    paper = paper_variances(epsilon, delta, k, oracles["olh"].buckets, q)
    for name, oracle in oracles.items():
        assert oracle.variance(0.0, 1) == pytest.approx(paper[name], rel=1e-6), name


@pytest.mark.parametrize("epsilon", [0.5, 2.0])
def test_a_delta_buys_variance(epsilon):
    for name in ORACLES:
        pure = ORACLES[name](epsilon=epsilon, categories=10).variance(0.0, 1)
        approximate = ORACLES[name](epsilon=epsilon, categories=10, delta=0.01).variance(0.0, 1)
        assert approximate < pure, name


# -- memoized GRR (L-GRR) -------------------------------------------------------------------

@pytest.mark.parametrize("memo_epsilon, epsilon", [(0.5, 2.0), (2.0, 1.0), (4.0, 4.0)])
@pytest.mark.parametrize("k", [2, 5])
def test_lgrr_reports_follow_the_two_layers_exact_pmf(memo_epsilon, epsilon, k):
    """A fresh memo then a report: GRR with p = p1 p2 + (1 - p1) q2, q = q1 p2 + (1 - q1)
    q2 from the two layers' exact weights (a wrong epsilon is told apart above)."""
    oracle = LongitudinalGRR(epsilon=epsilon, memo_epsilon=memo_epsilon, categories=k)
    p1, q1 = oracle.permanent.support_probabilities
    p2, q2 = oracle.instant.support_probabilities
    assert oracle.support_probabilities == (p1 * p2 + (1 - p1) * q2, q1 * p2 + (1 - q1) * q2)
    assert sum(oracle.pmf(0)) == 1  # exactly
    value = k // 2
    codes = oracle.perturb(np.full(N, value), np.random.default_rng(20 + k))
    cdf = np.cumsum([float(x) for x in oracle.pmf(value)])
    empirical = np.cumsum(np.bincount(codes, minlength=k)) / N
    assert np.max(np.abs(empirical - cdf)) < dkw_threshold(N)


@pytest.mark.parametrize("memo_epsilon, epsilon", [(0.5, 2.0), (2.0, 1.0), (8.0, 0.3)])
def test_lgrr_losses_exactly(memo_epsilon, epsilon):
    """What each report is charged is the instantaneous layer's exact loss (the bound for
    any number of reports sharing memos); one report alone reveals ln(p/q) of the two
    together, less than either layer; a memo reveals the permanent layer's."""
    oracle = LongitudinalGRR(epsilon=epsilon, memo_epsilon=memo_epsilon, categories=4)
    instant = GeneralizedRR(epsilon=epsilon, categories=4)
    permanent = GeneralizedRR(epsilon=memo_epsilon, categories=4)
    assert oracle.exact_privacy_loss() == instant.exact_privacy_loss()
    assert oracle.memo_loss() == permanent.exact_privacy_loss()
    p, q = oracle.support_probabilities
    single = oracle.single_report_loss()
    assert single == type(single)(p / q)
    assert float(single) < min(float(oracle.exact_privacy_loss()), float(oracle.memo_loss()))
    # A report's worst ratio over two values, from the exact pmf
    worst = max(a / b for u in range(4) for v in range(4)
                for a, b in zip(oracle.pmf(u), oracle.pmf(v)))
    assert worst == p / q


def test_reports_sharing_a_memo_never_exceed_the_instantaneous_bound():
    """Two reports of one value (one memo) against two of two values (two memos): the
    exact transcript probabilities differ by at most e^(2 ε), the bound the ledger
    charges, while a memo alone (no instantaneous layer) would tell them apart by
    ln(e^ε∞ + k - 1): why memoized reports are still charged per report."""
    k, memo_epsilon, epsilon = 5, 1.0, 0.7
    oracle = LongitudinalGRR(epsilon=epsilon, memo_epsilon=memo_epsilon, categories=k)
    p1, q1 = oracle.permanent.support_probabilities
    inst = [[float(x) for x in oracle.instant.pmf(b)] for b in range(k)]
    memo = [[float(x) for x in oracle.permanent.pmf(v)] for v in range(k)]

    def same(y1, y2, v):  # x = (v, v): one memo b
        return sum(memo[v][b] * inst[b][y1] * inst[b][y2] for b in range(k))

    def apart(y1, y2, v, w):  # x = (v, w): memos b, c
        return sum(memo[v][b] * inst[b][y1] for b in range(k)) * \
            sum(memo[w][c] * inst[c][y2] for c in range(k))

    worst = max(max(same(y1, y2, 0) / apart(y1, y2, 0, 1), apart(y1, y2, 0, 1) / same(y1, y2, 0))
                for y1 in range(k) for y2 in range(k))
    assert math.log(worst) <= 2 * float(oracle.exact_privacy_loss()) + 1e-12
    assert math.log(1 / float(q1)) > memo_epsilon  # a bare memo links more than ε∞
