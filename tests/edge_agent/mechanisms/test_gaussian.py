"""Opt-GM as a discrete Gaussian (edge_agent/mechanisms/gaussian.py): the sampler against
the exact pmf, σ against the paper's Eq. (4), δ and the pure loss against brute force
over the grid pmfs in 50-digit arithmetic."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext

import numpy as np
import pytest
from scipy import optimize, stats

from edge_agent.mechanisms import EPSILON_MIN, OptimalGaussian, SeededRandom, _kernels
from edge_agent.mechanisms.gaussian import analytic_sigma, discrete_gaussian_delta
from tests.edge_agent.mechanisms.helpers import FALSE_ALARM

N = 200_000


def exact_pmf(s: int, support: np.ndarray) -> np.ndarray:
    """P(Z = z) for N_Z(0, s) at ``support``, the normaliser summed to 50 digits."""
    with localcontext() as ctx:
        ctx.prec = 50
        reach = int(40 * math.sqrt(s)) + 10
        norm = sum((Decimal(-z * z) / (2 * s)).exp() for z in range(-reach, reach + 1))
        return np.array([float((Decimal(-int(z) ** 2) / (2 * s)).exp() / norm)
                         for z in support])


@pytest.mark.parametrize("t,m", [(1, 1), (2, 1), (3, 3), (11, 10), (101, 100)])
def test_the_kernel_draws_the_discrete_gaussian(t, m):
    """Chi-square of N draws of N_Z(0, t m) against the exact pmf (cells pooled so each
    expects at least 20), false alarm 1e-6."""
    s = t * m
    reach = int(7 * math.sqrt(s)) + 2
    codes = _kernels.gaussian_cells(np.zeros(N), SeededRandom(np.random.default_rng([7, t, m])),
                                    low=0.0, step=1.0, steps=1, offset=reach,
                                    top=2 * reach + 1, t=t, m=m)
    z = codes.astype(np.int64) - reach
    support = np.arange(-reach, reach + 1)
    expected = exact_pmf(s, support) * N
    observed = np.bincount(z + reach, minlength=support.size)[:support.size]
    assert observed.sum() == N  # nothing beyond 7 sigma (would be the clamped top)
    keep = expected >= 20
    pooled_obs = np.append(observed[keep], N - observed[keep].sum())
    pooled_exp = np.append(expected[keep], N - expected[keep].sum())
    statistic = float(((pooled_obs - pooled_exp) ** 2 / pooled_exp).sum())
    assert stats.chi2.sf(statistic, pooled_obs.size - 1) > FALSE_ALARM, (t, m, statistic)


def test_the_chi_square_detects_a_wrong_sigma():
    codes = _kernels.gaussian_cells(np.zeros(N), SeededRandom(np.random.default_rng(8)),
                                    low=0.0, step=1.0, steps=1, offset=40, top=81, t=4, m=3)
    z = codes.astype(np.int64) - 40
    support = np.arange(-40, 41)
    expected = exact_pmf(13, support) * N  # drawn with s = 12
    observed = np.bincount(z + 40, minlength=support.size)[:support.size]
    keep = expected >= 20
    statistic = float(((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum())
    assert stats.chi2.sf(statistic, keep.sum() - 1) < FALSE_ALARM


def test_huge_noise_takes_the_overflow_free_path():
    """|Y| - m beyond 3.04e9 squares past int64: the coins split the exponent instead (the
    result must be a rejection, exp(-huge)); checked on the building block directly."""
    words = SeededRandom(np.random.default_rng(3)).words(10_000)
    accepted, pos = _kernels._bernoulli_exp_square(4_000_000_000, 2 * 10**12, words, 0)
    assert pos > 0 and not accepted


@pytest.mark.parametrize("epsilon,delta", [(0.5, 1e-6), (1.0, 1e-6), (4.0, 1e-5),
                                           (2.0, 1e-3)])
def test_sigma_is_the_papers_equation_4(epsilon, delta):
    """σ = (ξ + √(ξ² + ε)) Δ / (ε √2), ξ solving erfc(ξ) - e^ε erfc(√(ξ² + ε)) = 2δ."""
    def gap(xi):
        return math.erfc(xi) - math.exp(epsilon) * math.erfc(math.sqrt(xi * xi + epsilon)) \
            - 2 * delta
    xi = optimize.brentq(gap, -10, 10, xtol=1e-15)
    paper = (xi + math.sqrt(xi * xi + epsilon)) * 2.0 / (epsilon * math.sqrt(2))
    assert analytic_sigma(epsilon, delta, 2.0) == pytest.approx(paper, rel=1e-9)


def grid_rows(mech: OptimalGaussian) -> list[list[Decimal]]:
    """P(code | lattice point i) for every i, every code, to 50 digits, clamped tails
    summed to 60 sigma."""
    s = mech.t * mech.m
    r, n = mech.tail_cells, mech.steps
    top = 2 * r + n
    reach = int(60 * math.sqrt(s)) + top
    with localcontext() as ctx:
        ctx.prec = 50
        weight = {z: (Decimal(-z * z) / (2 * s)).exp() for z in range(-reach, reach + 1)}
        norm = sum(weight.values())
        rows = []
        for i in range(n + 1):
            row = [weight[k - r - i] for k in range(top + 1)]
            row[0] = sum(weight[z] for z in range(-reach, -r - i + 1))
            row[top] = sum(weight[z] for z in range(top - r - i, reach + 1))
            rows.append([w / norm for w in row])
    return rows


@pytest.mark.parametrize("epsilon,delta,bits", [(1.0, 1e-6, 10), (4.0, 1e-6, 10),
                                                (0.5, 1e-3, 9), (2.0, 1e-2, 8)])
def test_delta_and_pure_loss_bound_every_pair_of_grid_pmfs(epsilon, delta, bits):
    """Brute force over every pair of lattice points (rounded inputs mix them): the largest
    hockey-stick divergence at ε is at most exact_delta, which is at most the configured δ
    and within 1e-6 of the unclamped shift's own (clamping takes off only the tails); the
    largest log ratio of two rows is at most the pure loss bound, and close to it."""
    mech = OptimalGaussian(epsilon=epsilon, delta=delta, low=-1.0, high=1.0, grid_bits=bits)
    rows = grid_rows(mech)
    with localcontext() as ctx:
        ctx.prec = 50
        e = Decimal(epsilon).exp()
        worst = max(sum(max(Decimal(0), a - e * b) for a, b in zip(u, v))
                    for u in rows for v in rows)
        ratio = max(max(a / b for a, b in zip(u, v)) for u in rows for v in rows)
        # The unclamped shift by the whole domain, summed directly.
        s, n = mech.t * mech.m, mech.steps
        reach = int(60 * math.sqrt(s)) + n
        weight = {z: (Decimal(-z * z) / (2 * s)).exp() for z in range(-reach - n, reach + 1)}
        norm = sum(weight[z] for z in range(-reach, reach + 1))
        shift = sum(max(Decimal(0), weight[z] - e * weight[z - n])
                    for z in range(-reach, reach + 1)) / norm
    charged = mech.exact_delta()
    assert worst <= charged <= Decimal(delta)
    assert charged - shift <= Decimal("1e-6") * shift
    assert charged >= Decimal(delta) * Decimal("0.9")  # σ is not larger than it needs
    bound = mech.exact_privacy_loss()
    assert float(ratio.ln()) <= float(bound) and bound.at_most(1.15 * float(ratio.ln()))
    assert not bound.at_most(epsilon)  # pure only at a larger ε: the ledger charges (ε, δ)


@pytest.mark.parametrize("epsilon", [0.05, 1.0, 8.0])
def test_the_sampled_mean_is_the_input_and_the_spread_is_sigma(epsilon):
    """Off-lattice inputs (the random rounding) and the ends: mean within 5 standard errors
    of x (false alarm 6e-7), variance within 5 of its standard errors of σ²."""
    mech = OptimalGaussian(epsilon=epsilon, delta=1e-6, low=10.0, high=30.0)
    rng = np.random.default_rng([9, int(epsilon * 100)])
    for x in (10.0, 10.0 + 0.37 * mech.step, 21.234, 30.0):
        values = mech.perturb(np.full(N, x), rng)
        sigma2 = float(mech.variance(x))
        assert abs(values.mean() - x) < 5 * math.sqrt(sigma2 / N), (epsilon, x)
        assert abs(values.var() - sigma2) < 5 * sigma2 * math.sqrt(2 / N), (epsilon, x)
    assert mech.affine_mean() == (1.0, 0.0, 10.0, 30.0)


def test_delta_of_the_shift_matches_the_continuous_one_at_large_sigma():
    """At σ of thousands of cells the discrete δ and Balle-Wang's continuous δ agree."""
    from edge_agent.mechanisms.gaussian import gaussian_delta
    mech = OptimalGaussian(epsilon=1.0, delta=1e-6, low=0.0, high=1.0)
    continuous = gaussian_delta(math.sqrt(mech.t * mech.m), 1.0, mech.steps)
    assert discrete_gaussian_delta(mech.steps, mech.t, mech.m, 1.0) == pytest.approx(
        continuous, rel=1e-6)


def test_parameters_are_validated_and_name_the_key():
    with pytest.raises(ValueError, match=r"^delta: opt-gm is \(epsilon, delta\)-LDP"):
        OptimalGaussian(epsilon=1.0, delta=0.0, low=0.0, high=1.0)
    with pytest.raises(ValueError, match=r"^delta: must be in \[0, 0.1\]"):
        OptimalGaussian(epsilon=1.0, delta=0.5, low=0.0, high=1.0)
    with pytest.raises(TypeError):
        OptimalGaussian(epsilon=1.0, delta="1e-6", low=0.0, high=1.0)
    with pytest.raises(TypeError):
        OptimalGaussian(1.0, 1e-6, 0.0, 1.0)  # keyword-only
    with pytest.raises(ValueError, match=r"^grid_bits: 6 is too coarse for opt-gm at "
                                         r"epsilon=1, delta=1e-06: .* at least 69 cells"):
        OptimalGaussian(epsilon=1.0, delta=1e-6, low=0.0, high=1.0, grid_bits=6)
    with pytest.raises(ValueError, match=r"^grid_bits: 16 is too coarse for opt-gm"):
        OptimalGaussian(epsilon=EPSILON_MIN, delta=1e-6, low=0.0, high=1.0)
    OptimalGaussian(epsilon=1.0, delta=1e-6, low=0.0, high=1.0, grid_bits=7)
