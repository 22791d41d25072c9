"""Duchi et al.'s multi-dimensional mechanism (Wang et al. arXiv:1906.01777, Algorithms 1 and 4,
Appendix A): the published version breaks ε-LDP for even d and the fixed one does not, exactly;
(ε,δ) checked as the standard hockey-stick δ from the exact output probabilities; the
reports follow the exact pmf (DKW, false alarm 1e-6) and are unbiased."""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from edge_agent.mechanisms.multidimensional import (
    DuchiVector,
    SampledDuchi,
    half_spaces,
    hockey_stick,
    original_duchi_loss,
    paper_delta_alpha,
    random_axes,
)
from tests.edge_agent.mechanisms.helpers import dkw_threshold
from tests.edge_agent.mechanisms.helpers import hockey_stick as exact_delta_of

EPSILONS = [0.1, 0.5, 1.0, 2.0, 4.0]


def vertices(d):
    return list(itertools.product((-1, 1), repeat=d))


def brute_force_delta(mechanism, epsilon) -> Decimal:
    """The hockey-stick δ over extreme inputs (the max over all inputs is at extreme ones:
    the divergence is jointly convex, and every output distribution is a mixture of
    theirs)."""
    return exact_delta_of([mechanism.pmf(v) for v in vertices(mechanism.dimensions)], epsilon)


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("d", [1, 2, 3, 4, 5, 6, 9, 10])
def test_the_published_mechanism_breaks_epsilon_ldp_for_even_d_and_the_fix_holds(epsilon, d):
    published = original_duchi_loss(epsilon, d)
    assert published.at_most(epsilon) == (d % 2 == 1)
    fixed = DuchiVector(epsilon=epsilon, dimensions=d)
    assert fixed.exact_privacy_loss().at_most(epsilon)
    assert fixed.exact_delta() == 0


@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_the_loss_is_the_worst_ratio_of_the_exact_pmf(d):
    mechanism = DuchiVector(epsilon=1.0, dimensions=d)
    pmfs = [mechanism.pmf(v) for v in vertices(d)]
    assert all(sum(pmf.values()) == 1 for pmf in pmfs)
    worst = max(a[y] / b[y] for a, b in itertools.permutations(pmfs, 2) for y in a)
    assert mechanism.exact_privacy_loss().ratio == worst


@pytest.mark.parametrize("delta", [1e-6, 1e-3, 0.05])
@pytest.mark.parametrize("d", [1, 2, 3, 4])
def test_delta_is_the_hockey_stick_divergence_and_at_most_the_configured(delta, d):
    mechanism = DuchiVector(epsilon=1.0, dimensions=d, delta=delta)
    exact = brute_force_delta(mechanism, 1.0)
    assert abs(exact - mechanism.exact_delta()) < Decimal(10) ** -50
    assert exact <= Decimal(delta)
    # ... and tight: one unit more of α's weight would exceed it.
    more = Fraction(mechanism.alpha_weight + 1, 1 << 53)
    assert hockey_stick(more, d, 1.0) > Decimal(delta)


@pytest.mark.parametrize("d", [2, 3, 5, 10])
def test_the_papers_delta_is_per_output_a_standard_delta_c_d_times_larger(d):
    """Eq. 24 bounds δ per output: its hockey-stick divergence is |T+| δ."""
    epsilon, delta = 1.0, 1e-4
    alpha = paper_delta_alpha(epsilon, delta, d)
    plus, _ = half_spaces(d)
    standard = hockey_stick(alpha, d, epsilon)
    assert standard > Decimal(delta) or d == 1
    assert abs(standard - Decimal(plus) * Decimal(delta)) < Decimal(10) ** -12


def test_parameters_are_validated():
    with pytest.raises(TypeError):
        DuchiVector(1.0, 3)
    with pytest.raises(TypeError, match="dimensions must be an integer"):
        DuchiVector(epsilon=1.0, dimensions=2.0)
    with pytest.raises(ValueError, match=r"dimensions: must be in \[1, 62\]"):
        DuchiVector(epsilon=1.0, dimensions=63)
    with pytest.raises(ValueError, match=r"delta: must be in \[0, 0.1\]"):
        DuchiVector(epsilon=1.0, dimensions=2, delta=0.5)
    mechanism = DuchiVector(epsilon=1.0, dimensions=3)
    with pytest.raises(ValueError, match=r"\(n, 3\) array"):
        mechanism.perturb(np.zeros((4, 2)))
    with pytest.raises(ValueError, match="finite"):
        mechanism.perturb(np.array([[0.0, np.nan, 0.0]]))


@pytest.mark.parametrize("d", [2, 3, 4])
@pytest.mark.parametrize("delta", [0.0, 0.01])
def test_reports_of_an_extreme_input_follow_the_exact_pmf(d, delta):
    mechanism = DuchiVector(epsilon=1.5, dimensions=d, delta=delta)
    vertex = tuple(1 if j % 2 else -1 for j in range(d))
    n = 200_000
    signs = mechanism.perturb_signs(np.tile(np.array(vertex, float), (n, 1)),
                                    np.random.default_rng(d))
    pmf = mechanism.pmf(vertex)
    index = {pattern: sum(1 << j for j, s in enumerate(pattern) if s == 1) for pattern in pmf}
    probabilities = np.zeros(1 << d)
    for pattern, p in pmf.items():
        probabilities[index[pattern]] = float(p)
    empirical = np.cumsum(np.bincount(signs.astype(np.int64), minlength=1 << d)) / n
    assert np.max(np.abs(empirical - np.cumsum(probabilities))) < dkw_threshold(n)


@pytest.mark.parametrize("d,delta", [(1, 0.0), (2, 0.0), (5, 0.0), (4, 0.01)])
def test_reports_are_unbiased(d, delta):
    mechanism = DuchiVector(epsilon=2.0, dimensions=d, delta=delta)
    rng = np.random.default_rng(10 + d)
    x = rng.uniform(-1, 1, d)
    n = 200_000
    reports = mechanism.perturb(np.tile(x, (n, 1)), rng)
    stderr = np.sqrt(mechanism.variance(x) / n)
    assert np.all(np.abs(reports.mean(axis=0) - x) < 5.3 * stderr)  # 1e-7 each, d axes
    assert np.allclose(reports.var(axis=0), mechanism.variance(x), rtol=0.05)


def test_one_dimension_is_algorithm_2():
    """d = 1 at (ε, δ): P[+B] = (e^ε + 2δ - 1)/(2(e^ε + 1)) x + 1/2 and
    B = (e^ε + 1)/(e^ε + 2δ - 1) (Algorithm 2), with δ as the standard δ: α = (e^ε + δ) /
    (e^ε + 1)."""
    epsilon, delta = 1.0, 0.01
    mechanism = DuchiVector(epsilon=epsilon, dimensions=1, delta=delta)
    e = math.exp(epsilon)
    assert float(mechanism.alpha) == pytest.approx((e + delta) / (e + 1), rel=1e-12)
    assert float(mechanism.scale) == pytest.approx((e + 1) / (e + 2 * delta - 1), rel=1e-12)


# -- Mechanism-2: k of d axes ---------------------------------------------------------------

@pytest.mark.parametrize("epsilon,delta", [(1.0, 0.0), (4.0, 1e-6), (9.0, 1e-4), (15.36, 0.0)])
@pytest.mark.parametrize("d", [1, 3, 8])
def test_k_of_d_composes_to_at_most_epsilon_and_delta_exactly(epsilon, delta, d):
    mechanism = SampledDuchi(epsilon=epsilon, dimensions=d, delta=delta)
    assert mechanism.k * Fraction(mechanism.axis.epsilon) <= Fraction(epsilon)
    assert mechanism.exact_delta() <= Decimal(delta)  # each axis: its hockey-stick δ at ε/k
    # With δ = 0 the guarantee is pure: the worst ratio of k axis reports is within e^ε.
    assert mechanism.exact_privacy_loss().at_most(epsilon) or delta > 0


@pytest.mark.parametrize("epsilon", [0.5, 2.0, 5.0, 9.0, 13.0])
@pytest.mark.parametrize("d", [2, 5, 10])
def test_k_minimises_the_closed_form_variance_like_lemma_5(epsilon, d):
    mechanism = SampledDuchi(epsilon=epsilon, dimensions=d, delta=1e-6)
    variances = [mechanism._worst_variance(k) for k in range(1, d + 1)]
    assert mechanism.k == 1 + int(np.argmin(variances))
    lemma = SampledDuchi.lemma5_k(epsilon, d)
    assert abs(mechanism.k - lemma) <= 1  # Lemma 5 floors ε / 2.17


def test_k_of_d_is_unbiased_with_its_closed_form_variance():
    mechanism = SampledDuchi(epsilon=6.0, dimensions=6, delta=1e-4)
    rng = np.random.default_rng(21)
    x = rng.uniform(-1, 1, 6)
    n = 200_000
    reports = mechanism.perturb(np.tile(x, (n, 1)), rng)
    assert np.all(np.count_nonzero(reports, axis=1) == mechanism.k)
    stderr = np.sqrt(mechanism.variance(x) / n)
    assert np.all(np.abs(reports.mean(axis=0) - x) < 5.3 * stderr)
    assert np.allclose(reports.var(axis=0), mechanism.variance(x), rtol=0.05)


def test_k_is_validated():
    with pytest.raises(ValueError, match=r"k: must be in \[1, 3\]"):
        SampledDuchi(epsilon=1.0, dimensions=3, k=4)
    with pytest.raises(TypeError, match="k must be an integer"):
        SampledDuchi(epsilon=1.0, dimensions=3, k=1.5)


# -- the kernels against slow, obvious references --------------------------------------------

def reference_sign_vectors(x, words, alpha):
    """Algorithm 1 per tuple with Python integers, from the same words as the kernel: d
    words for V, one for u, then low d bits of a word per try until the pattern lies in
    the half (T+ or T-) u chose."""
    n, d = x.shape
    out, pos = [], 0
    for i in range(n):
        v = 0
        for j in range(d):
            if int(words[pos]) >> 11 < math.floor((1.0 + float(x[i, j])) * 2.0**52):
                v |= 1 << j
            pos += 1
        plus = int(words[pos]) >> 11 < alpha
        pos += 1
        while True:
            s = int(words[pos]) & ((1 << d) - 1)
            pos += 1
            agreements = sum(((s >> j) & 1) == ((v >> j) & 1) for j in range(d))
            if (2 * agreements > d) == plus:
                out.append(s)
                break
    return out


@pytest.mark.parametrize("d", [1, 2, 5, 62])
def test_the_sign_kernel_matches_the_reference(d):
    from edge_agent.mechanisms import _categorical

    mechanism = DuchiVector(epsilon=1.0, dimensions=d)
    rng = np.random.default_rng(d)
    x = np.ascontiguousarray(rng.uniform(-1, 1, (300, d)))
    x[0] = 1.0  # the ends: V is certain
    x[1] = -1.0
    words = rng.integers(0, 2**64, 300 * (d + 1) + 5000, dtype=np.uint64)
    out = np.zeros(300, dtype=np.uint64)
    done, _ = _categorical.sign_vectors(x, words, np.uint64(mechanism.alpha_weight), out, 0)
    assert done == 300
    assert out.tolist() == reference_sign_vectors(x, words, mechanism.alpha_weight)


def reference_sampled_axes(words, n, d, k):
    """k of d axes per tuple by a partial Fisher-Yates shuffle, each step's index a whole
    word modulo the axes left, words below 2**64 mod (axes left) thrown away."""
    out, pos = [], 0
    for _ in range(n):
        order, mask = list(range(d)), 0
        for t in range(k):
            while True:
                r = int(words[pos])
                pos += 1
                if r >= 2**64 % (d - t):
                    break
            j = t + r % (d - t)
            order[t], order[j] = order[j], order[t]
            mask |= 1 << order[t]
        out.append(mask)
    return out


@pytest.mark.parametrize("d,k", [(2, 1), (3, 2), (7, 3), (62, 62), (62, 5)])
def test_the_axis_sampling_kernel_matches_the_reference(d, k):
    from edge_agent.mechanisms import _categorical

    rng = np.random.default_rng(100 + d + k)
    words = rng.integers(0, 2**64, 500 * k + 100, dtype=np.uint64)
    # Words a step must throw away (below 2**64 mod (d - t)): the first try of every step
    # of the first tuple.
    words[:k] = 0
    words[k:2 * k] = 2**63
    out = np.zeros(250, dtype=np.uint64)
    done, used = _categorical.sampled_axes(words, k, np.empty(d, dtype=np.int64), out, 0)
    assert done == 250
    expected = reference_sampled_axes(words, 250, d, k)
    assert out.tolist() == expected
    assert all(bin(mask).count("1") == k for mask in expected)
    # Out of words halfway: it stops at a tuple boundary, and goes on from there.
    short = np.zeros(250, dtype=np.uint64)
    done, used = _categorical.sampled_axes(words[:3 * k + 1], k, np.empty(d, dtype=np.int64),
                                           short, 0)
    assert done < 250 and used <= 3 * k + 1
    assert short[:done].tolist() == expected[:done]


@pytest.mark.parametrize("d,k", [(3, 1), (5, 2), (6, 3)])
def test_random_axes_are_uniform_over_the_k_subsets(d, k):
    """What a vector channel's k-of-d strategy and sampled-duchi draw: each of the C(d, k)
    subsets equally often (chi-square, false alarm 1e-6)."""
    n = 60_000
    chosen = random_axes(n, d, k, np.random.default_rng([17, d, k]))
    assert chosen.shape == (n, d) and np.all(chosen.sum(axis=1) == k)
    masks = chosen.astype(np.int64) @ (1 << np.arange(d))
    subsets = [sum(1 << a for a in c) for c in itertools.combinations(range(d), k)]
    observed = np.array([np.count_nonzero(masks == m) for m in subsets])
    assert observed.sum() == n
    _, p_value = stats.chisquare(observed)
    assert p_value > 1e-6, observed
    with pytest.raises(ValueError, match="k, d"):
        random_axes(3, 65, 2)


def joint_outcomes(mechanism: SampledDuchi, values, rng):
    """Each tuple's (sampled axes, their signs) as one index: axes mask + signs << d."""
    chosen, signs, _ = mechanism._draw(values, rng)
    bits = np.zeros(chosen.shape, dtype=np.int64)
    bits[chosen] = signs
    weights = 1 << np.arange(mechanism.dimensions, dtype=np.int64)
    masks = weights @ chosen.astype(np.int64)
    return masks + ((weights @ bits) << mechanism.dimensions)


def outcome_index(axes, signs, d):
    mask = sum(1 << a for a in axes)
    return mask + (sum(1 << a for a, s in zip(axes, signs) if s == 1) << d)


@pytest.mark.parametrize("d,k,delta", [(2, 1, 0.0), (4, 2, 0.0), (5, 3, 1e-3), (6, 6, 0.0)])
def test_sampled_reports_of_an_extreme_input_follow_the_exact_pmf(d, k, delta):
    mechanism = SampledDuchi(epsilon=2.0, dimensions=d, delta=delta, k=k, low=10.0, high=30.0)
    vertex = tuple(1 if j % 3 else -1 for j in range(d))
    n = 200_000
    values = np.tile(np.where(np.array(vertex) == 1, 30.0, 10.0), (n, 1))
    outcomes = joint_outcomes(mechanism, values, np.random.default_rng(40 + d))
    pmf = mechanism.pmf(vertex)
    assert sum(pmf.values()) == 1 and len(pmf) == math.comb(d, k) * 2**k
    index = sorted((outcome_index(axes, signs, d), p) for (axes, signs), p in pmf.items())
    keys = np.array([i for i, _ in index])
    counts = np.bincount(np.searchsorted(keys, outcomes), minlength=keys.size)
    assert counts.sum() == n and np.all(keys[np.searchsorted(keys, outcomes)] == outcomes)
    empirical = np.cumsum(counts) / n
    assert np.max(np.abs(empirical - np.cumsum([float(p) for _, p in index]))) \
        < dkw_threshold(n)


def test_the_goodness_of_fit_sees_a_wrong_alpha():
    right = SampledDuchi(epsilon=2.0, dimensions=3, k=2)
    wrong = SampledDuchi(epsilon=2.2, dimensions=3, k=2)
    n, vertex = 200_000, (1, -1, 1)
    outcomes = joint_outcomes(right, np.tile(np.array(vertex, float), (n, 1)),
                              np.random.default_rng(3))
    index = sorted((outcome_index(a, s, 3), p) for (a, s), p in wrong.pmf(vertex).items())
    keys = np.array([i for i, _ in index])
    empirical = np.cumsum(np.bincount(np.searchsorted(keys, outcomes),
                                      minlength=keys.size)) / n
    assert np.max(np.abs(empirical - np.cumsum([float(p) for _, p in index]))) \
        > dkw_threshold(n)


@pytest.mark.parametrize("d,k,delta", [(2, 1, 0.0), (3, 2, 0.0), (3, 2, 1e-3), (4, 4, 1e-4)])
def test_sampled_loss_and_delta_against_the_exact_pmf(d, k, delta):
    """The charged loss is the worst ratio of the joint pmf (k axes, each at its worst);
    the charged δ (k times an axis', basic composition) bounds the exact hockey-stick
    divergence at ε, and is it for k = 1."""
    mechanism = SampledDuchi(epsilon=2.0, dimensions=d, delta=delta, k=k)
    pmfs = [mechanism.pmf(v) for v in vertices(d)]
    worst = max(a[y] / b[y] for a, b in itertools.permutations(pmfs, 2) for y in a)
    assert mechanism.exact_privacy_loss().ratio == worst
    assert mechanism.exact_privacy_loss().at_most(2.0) == (delta == 0)
    exact = exact_delta_of(pmfs, 2.0)
    assert exact <= mechanism.exact_delta() + Decimal(10) ** -50
    assert mechanism.exact_delta() <= Decimal(delta)
    if k == 1:
        assert abs(exact - mechanism.exact_delta()) < Decimal(10) ** -50


# -- the domain and each axis' distribution ---------------------------------------------------

@pytest.mark.parametrize("make", [
    lambda: DuchiVector(epsilon=1.0, dimensions=3, delta=1e-4, low=-4.0, high=12.0),
    lambda: SampledDuchi(epsilon=3.0, dimensions=3, k=2, low=-4.0, high=12.0)])
def test_each_axis_codes_follow_the_marginal_on_the_domain(make):
    """On [low, high] an axis' codes are 1 with the marginal's probability, the atoms'
    mean is the value (unbiased) and their variance the closed form's."""
    mechanism = make()
    marginal = mechanism.components[0]
    x = np.array([-4.0, 2.5, 11.0])
    n = 200_000
    codes, clipped = mechanism.perturb_codes(np.tile(x, (n, 1)), np.random.default_rng(7),
                                             return_clipped=True)
    assert clipped == 0 and len(codes) == 3
    origin, step = marginal.grid_values
    for axis, part in enumerate(codes):
        assert part.dtype == np.uint32 and set(np.unique(part).tolist()) <= {0, 1}
        up = float(marginal.pdf(x[axis], marginal.output_high))
        assert abs(part.mean() - up) < dkw_threshold(part.size)
        assert float(marginal.pdf(x[axis], marginal.output_low)) == pytest.approx(1 - up)
        assert origin + step * up == pytest.approx(x[axis], abs=1e-9)  # unbiased
        values = origin + step * part
        assert values.var() == pytest.approx(float(marginal.variance(x[axis])), rel=0.03)
    assert float(marginal.cdf(0.0, marginal.output_low - 1)) == 0.0
    assert float(marginal.cdf(0.0, marginal.output_high)) == 1.0


def test_values_outside_the_domain_are_clipped_and_counted():
    mechanism = DuchiVector(epsilon=1.0, dimensions=2, low=0.0, high=10.0)
    values = np.array([[-5.0, 5.0], [20.0, 10.0], [0.0, 11.0]])
    _, clipped = mechanism.perturb_codes(values, np.random.default_rng(1), return_clipped=True)
    assert clipped == 3
    sampled = SampledDuchi(epsilon=1.0, dimensions=2, k=1, low=0.0, high=10.0)
    assert sampled.perturb_codes(values, np.random.default_rng(1), return_clipped=True)[1] == 3


def test_sampled_codes_go_to_the_axes_each_tuple_sampled():
    mechanism = SampledDuchi(epsilon=2.0, dimensions=4, k=2)
    codes = mechanism.perturb_codes(np.zeros((1000, 4)), np.random.default_rng(2))
    assert sum(part.size for part in codes) == 2 * 1000
    assert all(abs(part.size - 500) < 5.3 * math.sqrt(1000 * 0.25) for part in codes)
    assert mechanism.codes_problem([part.size for part in codes]) is None
    assert mechanism.codes_problem([3, 0, 0, 0]) is not None
    empty = mechanism.perturb_codes(np.zeros((0, 4)))
    assert [part.size for part in empty] == [0, 0, 0, 0]


def test_domains_and_descriptions_are_validated_and_compared():
    with pytest.raises(ValueError, match="low, high"):
        DuchiVector(epsilon=1.0, dimensions=2, low=1.0, high=1.0)
    with pytest.raises(TypeError, match="high must be a real number"):
        SampledDuchi(epsilon=1.0, dimensions=2, high="2")
    with pytest.raises(ValueError, match="too wide"):
        DuchiVector(epsilon=1e-5, dimensions=2, low=-1e304, high=1e304)
    a = SampledDuchi(epsilon=1.0, dimensions=3, delta=1e-6, low=0.0, high=2.0)
    b = SampledDuchi(epsilon=1.0, dimensions=3, delta=1e-6, low=0.0, high=2.0, k=a.k)
    assert a == b and hash(a) == hash(b) and a != DuchiVector(epsilon=1.0, dimensions=3)
    assert a.describe() == {"name": "sampled-duchi", "epsilon": 1.0, "dimensions": 3,
                            "delta": 1e-6, "k": a.k, "low": 0.0, "high": 2.0}
