"""II-PTT (OPTT Sec. 3.3.2): Theorem 7 from the closed forms, the exact loss from the
integer weights, reports that follow the exact pmf (DKW, false alarm 1e-6), a mean of x
up to the centre's rounding, and the discrete variance close to Eq. 22."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_agent.mechanisms.tent import (
    TypeIIPTT,
    i_ptt_variance,
    ii_ptt_geometry,
    ii_ptt_variance,
    optimal_eta,
)
from tests.edge_agent.mechanisms.helpers import dkw_threshold


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


@pytest.mark.parametrize("epsilon", [1e-5, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0])
@pytest.mark.parametrize("grid_bits", [8, 12, 16])
def test_the_loss_from_the_integer_weights_is_within_epsilon(epsilon, grid_bits):
    mechanism = TypeIIPTT(epsilon=epsilon, low=-1.0, high=1.0, grid_bits=grid_bits)
    assert mechanism.exact_privacy_loss().at_most(epsilon)
    total = mechanism.ticks * mechanism.floor + mechanism.slope * mechanism.half ** 2
    assert total <= 1 << 53


def test_the_loss_is_the_worst_ratio_of_the_exact_pmf():
    mechanism = TypeIIPTT(epsilon=1.0, low=0.0, high=1.0, grid_bits=8)
    pmfs = [mechanism.pmf(x) for x in np.linspace(0, 1, 9)]
    assert all(sum(pmf) == 1 for pmf in pmfs)
    worst = max(max(a / b for a, b in zip(u, v)) for u in pmfs for v in pmfs)
    assert worst == mechanism.exact_privacy_loss().ratio


@pytest.mark.parametrize("x", [-1.0, -0.3, 0.0, 0.8, 1.0])
@pytest.mark.parametrize("epsilon", [0.5, 3.0])
def test_reports_follow_the_exact_pmf(x, epsilon):
    mechanism = TypeIIPTT(epsilon=epsilon, low=-1.0, high=1.0, grid_bits=10)
    n = 200_000
    codes = mechanism.perturb_codes(np.full(n, x), np.random.default_rng(int(10 * x) + 20))
    cdf = np.cumsum(mechanism.pmf(x).astype(np.float64))
    empirical = np.cumsum(np.bincount(codes, minlength=mechanism.ticks)) / n
    assert np.max(np.abs(empirical - cdf)) < dkw_threshold(n)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 4.0])
def test_the_mean_is_x_and_the_variance_is_equation_22(epsilon):
    mechanism = TypeIIPTT(epsilon=epsilon, low=-1.0, high=1.0, grid_bits=14)
    for x in (-1.0, -0.4, 0.0, 0.7, 1.0):
        assert abs(mechanism.mean_output(x) - x) <= mechanism.tick_width / 2 + 1e-12
        assert mechanism.variance(x) == pytest.approx(
            ii_ptt_variance(epsilon, mechanism.eta, x), rel=2e-3)


def test_the_domain_is_mapped_and_reports_are_unbiased():
    mechanism = TypeIIPTT(epsilon=1.0, low=10.0, high=30.0)
    rng = np.random.default_rng(5)
    reports = mechanism.perturb(np.full(200_000, 24.0), rng)
    stderr = math.sqrt(mechanism.variance(24.0) / reports.size)
    assert abs(reports.mean() - 24.0) < 5.3 * stderr + mechanism.tick_width * 10


def test_eta_minimises_the_worst_case_variance():
    for epsilon in (0.5, 2.0, 6.0):
        eta = optimal_eta(epsilon)
        best = ii_ptt_variance(epsilon, eta)
        assert best <= min(ii_ptt_variance(epsilon, e) for e in np.linspace(1.05, 60, 400))


def test_parameters_are_validated():
    with pytest.raises(TypeError):
        TypeIIPTT(1.0, 0.0, 1.0)
    with pytest.raises(ValueError, match=r"grid_bits: must be in \[8, 16\]"):
        TypeIIPTT(epsilon=1.0, low=0.0, high=1.0, grid_bits=4)
    with pytest.raises(ValueError, match=r"epsilon: must be in"):
        TypeIIPTT(epsilon=0.0, low=0.0, high=1.0)
    with pytest.raises(ValueError, match="finite"):
        TypeIIPTT(epsilon=1.0, low=0.0, high=1.0).perturb([np.nan])
