"""II-PTT (OPTT Sec. 3.3.2): Theorem 7 from the closed forms; the exact loss from the
integer weights; reports that follow the exact pmf (chi-square, false alarm 1e-6); a mean
that is exactly x thanks to the randomized centre; closed forms that are the pmf's; and
the discrete variance close to Eq. 22."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from edge_agent.mechanisms import ExactLoss, TypeIIPTT, from_description
from edge_agent.mechanisms.tent import (
    i_ptt_variance,
    ii_ptt_geometry,
    ii_ptt_variance,
    optimal_eta,
)
from tests.edge_agent.mechanisms import reference
from tests.edge_agent.mechanisms.helpers import FALSE_ALARM


@pytest.mark.parametrize("epsilon", [0.05, 0.3, 0.7, 1.0, 1.09])
@pytest.mark.parametrize("eta", [1.01, 1.5, 2.0, 5.0, 40.0])
def test_theorem_7_i_ptt_has_the_smaller_variance_below_ln_3(epsilon, eta):
    assert epsilon < math.log(3)
    k, a = ii_ptt_geometry(epsilon, eta)
    for x in (0.0, 0.5, 1.0):
        assert i_ptt_variance(epsilon, k, a, x) < ii_ptt_variance(epsilon, eta, x)


def test_theorem_7_is_tight_above_ln_3():
    """Above ln 3 some k and a make II-PTT the better one (η^3 < (e^ε - 1) / 2)."""
    epsilon, eta = 2.0, 1.05
    k, a = ii_ptt_geometry(epsilon, eta)
    assert eta ** 3 < math.expm1(epsilon) / 2
    assert ii_ptt_variance(epsilon, eta) < i_ptt_variance(epsilon, k, a)


def test_eta_minimises_the_worst_case_variance():
    for epsilon in (0.5, 2.0, 6.0):
        eta = optimal_eta(epsilon)
        best = ii_ptt_variance(epsilon, eta)
        assert best <= min(ii_ptt_variance(epsilon, e) for e in np.linspace(1.05, 60, 400))


# -- privacy, exactly from the integer pieces -------------------------------------------------

@pytest.mark.parametrize("epsilon", [1e-5, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0])
@pytest.mark.parametrize("grid_bits", [1, 2, 8, 12, 16])
def test_the_loss_from_the_integer_weights_is_within_epsilon_and_spends_it(epsilon, grid_bits):
    m = TypeIIPTT(epsilon=epsilon, low=-1.0, high=1.0, grid_bits=grid_bits)
    assert m.total == m.ticks * m.floor + m.slope * m.half ** 2 <= 1 << 53
    assert 1 <= m.half <= m.ticks // 2
    loss = m.exact_privacy_loss()
    assert loss.at_most(epsilon)
    # The peak-to-floor ratio (F + E A) / F, with F the least for its E: one less is over.
    assert loss.ratio == Fraction(m.floor + m.slope * m.half, m.floor)
    assert not ExactLoss(Fraction(m.floor - 1 + m.slope * m.half, m.floor - 1)).at_most(epsilon)
    assert m.privacy_loss() > epsilon * (1 - 1e-8)


@pytest.mark.parametrize("epsilon,grid_bits", [(1.0, 1), (1.0, 3), (0.2, 6), (3.0, 8),
                                               (20.0, 5)])
def test_the_loss_is_the_worst_ratio_over_every_centre(epsilon, grid_bits):
    """Every input's pmf is a mixture of those of two neighbouring integer centres, so the
    worst ratio over all inputs is the worst over the integer centres: by brute force, in
    Fractions, it is ``exact_privacy_loss``; and inputs in between stay within it."""
    m = TypeIIPTT(epsilon=epsilon, low=0.0, high=1.0, grid_bits=grid_bits)
    integer_centres = [reference.tent_pmf_at(m, c, Fraction(0))
                       for c in range(m.first, m.last + 1)]
    assert integer_centres[0] == reference.tent_pmf(m, 0.0)
    assert integer_centres[-1] == reference.tent_pmf(m, 1.0)
    worst = max(max(column) / min(column) for column in zip(*integer_centres))
    assert worst == m.exact_privacy_loss().ratio
    between = [reference.tent_pmf(m, x) for x in np.linspace(0.0, 1.0, 37)]
    assert max(max(column) / min(column) for column in zip(*between)) <= worst


# -- the reports follow the exact pmf ------------------------------------------------------------

@pytest.mark.parametrize("epsilon,grid_bits", [(0.5, 8), (1.0, 10), (3.0, 8), (8.0, 10),
                                               (1.0, 2)])
@pytest.mark.parametrize("x", [-1.0, -0.37, 0.0, 0.81, 1.0])
def test_codes_pass_a_chi_square_test_against_grid_pmf(epsilon, grid_bits, x):
    m = TypeIIPTT(epsilon=epsilon, low=-1.0, high=1.0, grid_bits=grid_bits)
    n = 200_000
    rng = np.random.default_rng([2026, grid_bits, int(10 * epsilon), int(100 * x) + 100])
    codes = m.perturb_codes(np.full(n, x), rng)
    expected = m.grid_pmf(x) * n
    observed = np.bincount(codes, minlength=m.ticks)
    # Cells expected fewer than 5 times are pooled with their neighbours.
    pooled_e, pooled_o, e_sum, o_sum = [], [], 0.0, 0
    for e, o in zip(expected, observed):
        e_sum, o_sum = e_sum + e, o_sum + o
        if e_sum >= 5:
            pooled_e.append(e_sum)
            pooled_o.append(o_sum)
            e_sum, o_sum = 0.0, 0
    pooled_e[-1] += e_sum
    pooled_o[-1] += o_sum
    pooled_e, pooled_o = np.array(pooled_e), np.array(pooled_o)
    statistic = float(np.sum((pooled_o - pooled_e) ** 2 / pooled_e))
    assert statistic < stats.chi2.isf(FALSE_ALARM, pooled_e.size - 1), (statistic, x)


def test_the_chi_square_test_rejects_a_deterministic_centre():
    """The test above can fail: rounding the centre to the nearest tick (this sampler's
    first form) instead of the randomized centre is detected at a half-tick position."""
    m = TypeIIPTT(epsilon=3.0, low=-1.0, high=1.0, grid_bits=5)
    x = float(2 * (m.first + 0.5 - m.first) / (m.last - m.first) - 1)  # centre fraction 1/2
    centre, up = m._centre(x)
    assert abs(float(up[()]) - 0.5) < 1e-9
    n = 200_000
    codes = m.perturb_codes(np.full(n, x), np.random.default_rng(5))
    rounded = m.grid_pmf(m.low + (m.high - m.low) * (int(centre) + 1 - m.first)
                         / (m.last - m.first))
    expected, observed = rounded * n, np.bincount(codes, minlength=m.ticks)
    statistic = float(np.sum((observed - expected) ** 2 / expected))
    assert statistic > stats.chi2.isf(FALSE_ALARM, m.ticks - 1)


@pytest.mark.parametrize("epsilon,grid_bits", [(0.3, 6), (2.0, 8), (20.0, 4), (1.0, 1)])
def test_grid_pmf_is_the_exact_pmf(epsilon, grid_bits):
    m = TypeIIPTT(epsilon=epsilon, low=10.0, high=30.0, grid_bits=grid_bits)
    for x in [10.0, 30.0, 10.2, 17.77, 29.9, -5.0, 45.0]:
        exact = reference.tent_pmf(m, x)
        assert sum(exact) == 1
        assert np.allclose(m.grid_pmf(x), [float(p) for p in exact], rtol=1e-14, atol=0)


# -- the mean: exactly x -----------------------------------------------------------------------

@pytest.mark.parametrize("epsilon,grid_bits", [(0.5, 8), (1.0, 8), (4.0, 12), (1.0, 1)])
def test_the_mean_tick_is_exactly_affine_in_the_centre(epsilon, grid_bits):
    """In Fractions, E[tick] = (T - 1)/2 + share (c(x) - (T - 1)/2), c(x) the centre's float
    position: no staircase (a centre rounded to a tick is off by up to half a tick), and
    E[report] = x to the floats' rounding, over the whole domain."""
    m = TypeIIPTT(epsilon=epsilon, low=-1.0, high=3.0, grid_bits=grid_bits)
    middle = Fraction(m.ticks - 1, 2)
    for x in np.linspace(-1.0, 3.0, 41):
        pmf = reference.tent_pmf(m, float(x))
        mean = sum(t * p for t, p in enumerate(pmf))
        position = Fraction(float(m.centre_positions(x)))
        assert mean == middle + m.tent_share * (position - middle)
        assert float(m.mean_output(x)) == pytest.approx(x, abs=1e-13)
    assert m.affine_mean() == (1.0, 0.0, -1.0, 3.0)


def test_the_domain_is_mapped_and_reports_are_unbiased():
    m = TypeIIPTT(epsilon=1.0, low=10.0, high=30.0, grid_bits=8)
    for x in (10.0, 24.0, 29.97):
        reports = m.perturb(np.full(200_000, x), np.random.default_rng(int(x)))
        stderr = math.sqrt(float(m.variance(x)) / reports.size)
        assert abs(reports.mean() - x) < 5.3 * stderr  # false alarm about 1e-7


# -- the closed forms are the pmf's --------------------------------------------------------------

@pytest.mark.parametrize("epsilon,grid_bits", [(0.5, 10), (2.0, 8), (7.0, 16), (1.0, 1)])
def test_closed_forms_are_the_pmfs(epsilon, grid_bits):
    m = TypeIIPTT(epsilon=epsilon, low=-1.0, high=3.0, grid_bits=grid_bits)
    xs = np.array([-1.0, -0.63, 0.0, 1.0, 2.9, 3.0, 7.0])
    pmf = m.grid_pmf(xs)
    values = m.from_codes(np.arange(m.ticks))
    clipped = np.clip(xs, -1.0, 3.0)
    mean = pmf @ values
    assert np.allclose(m.mean_output(xs), mean, rtol=0, atol=1e-12 * np.abs(values).max())
    assert np.allclose(m.variance(xs), pmf @ values ** 2 - mean ** 2, rtol=1e-9)
    for p in (1, 2, 3):
        direct = (pmf * np.abs(values - clipped[:, None]) ** p).sum(axis=1)
        assert np.allclose(m.expected_error(xs, p), direct, rtol=1e-9)
    # cdf: steps of the pmf at the ticks' values, flat between; pdf: the masses.
    at_ticks = m.cdf(xs[:, None], values)
    assert np.allclose(np.diff(at_ticks, axis=1, prepend=0.0), pmf, rtol=0, atol=1e-15)
    between = values + 0.5 * m.cell_width
    assert np.array_equal(m.cdf(xs[:, None], between), at_ticks)
    assert np.all(m.cdf(xs[:, None], [m.output_low, np.nextafter(values[0], -np.inf)]) == 0)
    assert np.allclose(m.cdf(xs[:, None], [m.output_high, 1e300]), 1.0, rtol=0, atol=1e-12)
    assert np.allclose(m.pdf(xs[:, None], values), pmf, rtol=1e-13, atol=0)
    assert np.all(m.pdf(xs[:, None], between[:-1]) == 0)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
def test_the_variance_is_close_to_equation_22(epsilon):
    m = TypeIIPTT(epsilon=epsilon, low=-1.0, high=1.0, grid_bits=14)
    for x in (-1.0, -0.4, 0.0, 0.7, 1.0):
        assert float(m.variance(x)) == pytest.approx(ii_ptt_variance(epsilon, m.eta, x),
                                                     rel=2e-3)


# -- the API ---------------------------------------------------------------------------------------

def test_description_names_it_ii_ptt_and_rebuilds_it():
    m = TypeIIPTT(epsilon=1.5, low=-2.0, high=2.0, grid_bits=10)
    assert m.describe() == {"name": "ii-ptt", "epsilon": 1.5, "low": -2.0, "high": 2.0,
                            "grid_bits": 10}
    again = from_description(m.describe())
    assert again == m and np.array_equal(again.grid_pmf([0.3]), m.grid_pmf([0.3]))


def test_parameters_are_validated():
    with pytest.raises(TypeError):
        TypeIIPTT(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"grid_bits: must be in \[1, 16\]"):
        TypeIIPTT(epsilon=1.0, low=0.0, high=1.0, grid_bits=17)
    with pytest.raises(ValueError, match=r"epsilon: must be in"):
        TypeIIPTT(epsilon=0.0, low=0.0, high=1.0)
    with pytest.raises(ValueError, match="values: 1 of 1 values are NaN"):
        TypeIIPTT(epsilon=1.0, low=0.0, high=1.0).perturb([np.nan])
