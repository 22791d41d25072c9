"""The privacy guarantee, checked exactly from the pieces and empirically."""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import product

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from edge_agent.mechanisms import EPSILON_MIN, ExactLoss, PolarOGPM
from edge_agent.mechanisms._layout import TOTAL_BITS, TickLayout, max_extra_weight
from tests.edge_agent.mechanisms.helpers import PURE_KINDS, make

EPSILONS = np.geomspace(0.05, 10.0, 15)
DOMAINS = [(0.0, 1.0), (-2.0, 2.0), (1000.0, 1000.5), (-1e6, 3e6)]


@pytest.mark.parametrize("bits", [4, 10, 16])  # three items: parallel workers share them
@pytest.mark.parametrize("kind", PURE_KINDS)
def test_privacy_loss_at_most_epsilon_over_grid(kind, bits):
    for epsilon, (low, high) in product(EPSILONS, DOMAINS):
        m = make(kind, float(epsilon), low, high, grid_bits=bits)
        loss = m.exact_privacy_loss()
        assert loss.at_most(m.epsilon), (kind, epsilon, low, high, bits)
        assert m.privacy_loss() <= m.epsilon
        # ... and the mechanism spends what it is given, so we are not hiding
        # a weaker mechanism behind the bound (coarse grids with a tiny central
        # piece are the exception: a cell then averages over the piece).
        if bits == 16:
            assert m.privacy_loss() > m.epsilon * (1 - 1e-6)


@pytest.mark.parametrize("epsilon", [0.05, 1.0, 1 + 2 * math.pi, 10.0, 20.0])
@pytest.mark.parametrize("radius_max,weight", [(1.0, 1.0), (2.0, 1.0), (10.0, 0.2)])
def test_polar_privacy_composes_within_epsilon(epsilon, radius_max, weight):
    m = PolarOGPM(epsilon=epsilon, radius_max=radius_max, weight=weight)
    assert m.epsilon_radius + m.epsilon_angle <= epsilon
    assert m.exact_privacy_loss().at_most(epsilon)
    assert m.privacy_loss() <= epsilon


# Log-spaced weights and ones whose free optimum gives the radius (7.76...) or the angle
# (12.5...) a share of about 1e-12 or just under EPSILON_MIN at epsilon = 1, period 2 pi.
POLAR_WEIGHTS = [*np.geomspace(1e-6, 1e6, 25).tolist(), 7.7627405667777065,
                 7.762771617732209, 12.548236097779293]


@pytest.mark.parametrize("epsilon", [EPSILON_MIN, 1.0, 6.0])
@pytest.mark.parametrize("period", [2 * math.pi, 360.0])
def test_polar_builds_for_every_weight_within_epsilon(epsilon, period):
    """Every share is 0 (a uniform report) or at least EPSILON_MIN, so both components
    have an integer layout, and the pair's exact loss stays within epsilon."""
    for weight in POLAR_WEIGHTS:
        m = PolarOGPM(epsilon=epsilon, radius_max=1.0, weight=weight, period=period)
        for share in (m.epsilon_radius, m.epsilon_angle):
            assert share == 0.0 or share >= EPSILON_MIN, (weight, share)
        assert Fraction(m.epsilon_radius) + Fraction(m.epsilon_angle) <= Fraction(epsilon)
        assert m.exact_privacy_loss().at_most(epsilon), weight


@settings(max_examples=200, deadline=None)
@given(
    kind=st.sampled_from(PURE_KINDS),
    epsilon=st.floats(min_value=1e-3, max_value=20.0),
    low=st.floats(min_value=-1e6, max_value=1e6),
    width=st.floats(min_value=1e-3, max_value=1e6),
    bits=st.integers(min_value=1, max_value=16),
)
def test_privacy_loss_property(kind, epsilon, low, width, bits):
    m = make(kind, epsilon, low, low + width, grid_bits=bits)
    assert m.exact_privacy_loss().at_most(epsilon)


def test_weights_are_exact_integers_summing_to_a_power_of_two():
    for epsilon, fraction in product([1e-3, 0.05, 1.0, 7.3, 20.0], [0.01, 0.25, 0.5, 0.99]):
        layout = TickLayout.for_fraction(epsilon=epsilon, fraction=fraction, grid_bits=16)
        assert layout.total == 1 << TOTAL_BITS
        assert layout.extra_weight == max_extra_weight(layout.low_weight, epsilon)
        # D is the largest integer with (A + D) / A <= e**eps: one more breaks it.
        a, d = layout.low_weight, layout.extra_weight
        assert ExactLoss(Fraction(a + d, a)).at_most(epsilon)
        assert not ExactLoss(Fraction(a + d + 1, a)).at_most(epsilon)
        # The effective central length matches the requested fraction: one unit of A
        # moves it by about fraction*T/A ticks (a few ticks only when e**eps*fraction
        # is huge, which no mechanism here produces), so the best A is within that.
        target = fraction * layout.ticks
        assert abs(layout.effective_length - target) <= target / layout.low_weight + 0.5


@pytest.mark.parametrize("epsilon,fraction,grid_bits,circular", [
    (1.0, 0.3, 3, False), (1.0, 0.3, 3, True), (5.0, 0.02, 4, False), (5.0, 0.02, 4, True),
    (0.2, 0.9, 2, False), (0.2, 0.9, 5, True), (3.0, 0.004, 6, True),
])
def test_cell_ratio_candidates_equal_brute_force(epsilon, fraction, grid_bits, circular):
    """max_cell_ratio inspects only the kinks; enumerate every start to confirm."""
    layout = TickLayout.for_fraction(epsilon=epsilon, fraction=fraction, grid_bits=grid_bits,
                                     tick_bits=11)
    cells = np.arange(layout.n_cells)
    first, last = (0, layout.ticks - 1) if circular else (37, layout.ticks - layout.length - 5)
    starts = np.arange(first, last + 1)[:, None]
    weights = layout.cell_weights(starts, cells[None, :], circular)
    assert np.all(weights.sum(axis=1) == 1 << TOTAL_BITS)
    high, low = weights.max(axis=0), weights.min(axis=0)
    best = max(range(layout.n_cells), key=lambda k: high[k] / low[k])
    num, den = layout.max_cell_ratio(first, last, circular)
    assert num * int(low[best]) == den * int(high[best])


@pytest.mark.parametrize("kind", PURE_KINDS)
def test_grid_pmf_ratios_never_exceed_the_reported_loss(kind):
    m = make(kind, 2.0, -1.0, 1.0, grid_bits=10)
    xs = np.concatenate([np.linspace(-1, 1, 801), [-1.0, 1.0, -0.99999, 0.99999]])
    pmf = m.grid_pmf(xs)
    ratio = pmf.max(axis=0) / pmf.min(axis=0)
    assert np.log(ratio.max()) <= m.privacy_loss() + 1e-12
    assert np.log(ratio.max()) <= m.epsilon


@pytest.mark.parametrize("kind", PURE_KINDS)
def test_empirical_ratio_of_extreme_inputs_stays_within_e_eps(kind):
    """Histograms for x = low and x = high: no bin's count ratio beats e**eps.

    Given a bin's total count, the share from input 1 is Binomial with success
    probability at most e**eps / (1 + e**eps) under the guarantee; we reject
    when the one-sided tail falls below 1e-6 / bins.
    """
    eps = 1.0
    m = make(kind, eps, 0.0, 1.0)
    n, bins = 400_000, 32
    rng = np.random.default_rng(99)
    edges = np.linspace(0, m.n_cells, bins + 1)
    counts = []
    for x in (m.low, m.high):
        codes = m.perturb_codes(np.full(n, x), rng)
        counts.append(np.histogram(codes, bins=edges)[0])
    p_max = math.exp(eps) / (1 + math.exp(eps))
    worst = np.inf
    for a, b in (counts, counts[::-1]):
        for ca, cb in zip(a, b):
            if ca + cb:
                worst = min(worst, stats.binom.sf(ca - 1, ca + cb, p_max))
    assert worst > 1e-6 / bins


def test_empirical_ratio_test_detects_a_leaky_mechanism():
    """The same test fails for a mechanism that is really 2*eps private."""
    eps = 1.0
    leaky = make("ogpm", 2 * eps, 0.0, 1.0)
    n, bins = 400_000, 32
    rng = np.random.default_rng(99)
    edges = np.linspace(0, leaky.n_cells, bins + 1)
    a, b = (np.histogram(leaky.perturb_codes(np.full(n, x), rng), bins=edges)[0]
            for x in (0.0, 1.0))
    p_max = math.exp(eps) / (1 + math.exp(eps))
    worst = min(stats.binom.sf(ca - 1, ca + cb, p_max) for ca, cb in zip(a, b) if ca + cb)
    assert worst < 1e-6 / bins
