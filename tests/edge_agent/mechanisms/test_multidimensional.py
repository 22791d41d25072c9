"""Duchi et al.'s multi-dimensional mechanism (papers/003, Algorithms 1 and 4, Appendix
A): the published version breaks ε-LDP for even d and the fixed one does not, exactly;
(ε,δ) checked as the standard hockey-stick δ from the exact output probabilities; the
reports follow the exact pmf (DKW, false alarm 1e-6) and are unbiased."""

from __future__ import annotations

import itertools
import math
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from edge_agent.mechanisms.multidimensional import (
    DuchiVector,
    SampledDuchi,
    half_spaces,
    hockey_stick,
    original_duchi_loss,
    paper_delta_alpha,
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
