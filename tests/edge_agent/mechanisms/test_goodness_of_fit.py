"""Samples from ``perturb`` against the exact CDF, for every mechanism.

Two properties, each able to fail on its own:

1. The codes ``perturb_codes`` draws follow ``grid_pmf`` (the exact integer
   mechanism): a Kolmogorov-Smirnov test on the code CDF with the DKW bound,
   valid for discrete distributions, at a false-alarm rate of 1e-6.
2. ``grid_pmf`` is the paper's mechanism: its CDF at every cell edge equals the
   closed-form continuous CDF to within the sub-cell placement of interval ends.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from edge_agent.mechanisms import CircularOGPM, Duchi, PolarOGPM, TypeIIPTT
from edge_agent.mechanisms.tent import ii_ptt_geometry
from tests.edge_agent.mechanisms.helpers import (
    KINDS,
    continuous_cdf_at_cells,
    dkw_threshold,
    ks_statistic,
    make,
)

N = 200_000
SEED = 20261122


def _inputs(kind, low, high):
    """Domain ends, points near them, the middle; for circles, around the wrap point."""
    w = high - low
    if kind == "ogpm-circular":
        return [low, low + 1e-9 * w, high - 1e-9 * w, low + 0.5 * w, high + 0.3 * w]
    return [low, low + 0.01 * w, low + 0.5 * w, high - 0.003 * w, high]


CASES = [(kind, eps) for kind in KINDS for eps in (0.1, 1.0, 4.0, 10.0)]


@pytest.mark.parametrize("kind,epsilon", CASES)
def test_codes_follow_exact_cdf(kind, epsilon):
    low, high = (-2.0, 2.0)
    m = make(kind, epsilon, low, high)
    rng = np.random.default_rng([SEED, KINDS.index(kind), int(epsilon * 10)])
    threshold = dkw_threshold(N)
    for x in _inputs(kind, low, high):
        codes = m.perturb_codes(np.full(N, x), rng)
        pmf = np.asarray(m.grid_pmf(x), dtype=np.float64)
        # fsum: II-PTT's probabilities are not multiples of 2**-53, and a running sum of
        # 2**16 of them rounds by more than 1e-12.
        assert math.fsum(pmf) == pytest.approx(1.0, abs=1e-12)
        cdf = np.cumsum(pmf)
        assert ks_statistic(codes, cdf) < threshold, f"{kind} eps={epsilon} x={x}"


@pytest.mark.parametrize("kind,epsilon", CASES)
def test_grid_mechanism_is_the_paper_mechanism(kind, epsilon):
    low, high = (-2.0, 2.0)
    m = make(kind, epsilon, low, high)
    for x in _inputs(kind, low, high) + list(np.linspace(low, high, 7)):
        grid_cdf = np.cumsum(m.grid_pmf(x))
        paper_cdf = continuous_cdf_at_cells(m, x)
        # Interval ends are placed on a grid of 2**20 ticks: at most one tick of
        # the high density moves. Laplace inputs sit at cell centres (half a cell);
        # Opt-GM's at lattice points, rounded at random between two.
        if kind in ("laplace", "bounded-laplace", "opt-gm"):
            slack = 2.0 * float(np.max(m.pdf(x, m.cell_edges()))) * m.cell_width
        elif isinstance(m, Duchi):
            slack = 2.0**-18
        elif isinstance(m, TypeIIPTT):
            # Whole ticks: the tent's half-width A rounded (half a tick) and its triangle
            # drawn on ticks; and its share, so k, from integer weights (the floor's
            # width moves with k).
            slack = 0.5 / m.half + abs(m.k / ii_ptt_geometry(epsilon, m.eta)[0] - 1.0)
        else:
            slack = 2.0 * m.p_high * (m.output_high - m.output_low) / m.layout.ticks
        assert np.max(np.abs(grid_cdf - paper_cdf)) <= slack + 1e-12, f"{kind} x={x}"


@pytest.mark.parametrize("period,origin", [(2 * np.pi, 0.0), (360.0, -180.0)])
def test_huge_angles_follow_exact_cdf(period, origin):
    """A finite angle of any size: the kernel's codes follow grid_pmf of that angle (both
    wrap its exact remainder; (x - origin) * 2**20 / period used to overflow or lose the
    angle, and the kernel and grid_pmf then drew from different arcs)."""
    m = CircularOGPM(epsilon=1.0, period=period, origin=origin)
    rng = np.random.default_rng([SEED, 5])
    for x in [1e300, -1e300, 1e308, -1.7e308, 1e20, -3e15]:
        codes = m.perturb_codes(np.full(N, x), rng)
        assert ks_statistic(codes, np.cumsum(m.grid_pmf(x))) < dkw_threshold(N), x


@pytest.mark.parametrize("kind", [kind for kind in KINDS if kind != "ogpm-circular"])
@pytest.mark.parametrize("low,high", [(0.0, 1e-100), (1.0, 1.0 + 2.0**-31),
                                      (-1e290, 1e290)])
def test_extreme_accepted_domains_follow_exact_cdf(kind, low, high):
    """The narrowest domains the width rule accepts, and a wide one.  (Not at EPSILON_MIN:
    bounded Laplace redraws about 2 / epsilon times per value; test_api runs it there.)"""
    rng = np.random.default_rng([SEED, 6, KINDS.index(kind)])
    for epsilon in (0.1, 4.0):
        m = make(kind, epsilon, low, high)
        for x in (low, high, 0.5 * low + 0.5 * high):
            codes = m.perturb_codes(np.full(N // 4, x), rng)
            cdf = np.cumsum(m.grid_pmf(x))
            assert ks_statistic(codes, cdf) < dkw_threshold(N // 4), (kind, epsilon, x)


def test_polar_components_follow_exact_cdf():
    m = PolarOGPM(epsilon=6.0, radius_max=2.0)
    rng = np.random.default_rng(SEED)
    radius = np.full(N, 1.9)
    angle = np.full(N, 6.28)  # just below 2 pi: the wrap point
    r_codes, a_codes = m.perturb_codes(radius, angle, rng)
    r_pmf, a_pmf = m.grid_pmf((1.9, 6.28))
    assert ks_statistic(r_codes, np.cumsum(r_pmf)) < dkw_threshold(N)
    assert ks_statistic(a_codes, np.cumsum(a_pmf)) < dkw_threshold(N)
    # The two components use independent words: their codes are uncorrelated.
    corr = np.corrcoef(r_codes.astype(float), a_codes.astype(float))[0, 1]
    assert abs(corr) < 6 / np.sqrt(N)


# -- the test above can fail: it rejects mechanisms that are slightly wrong -------------

@pytest.mark.parametrize("kind", ["ogpm", "ogpm-circular", "pm", "sw", "ptt", "duchi", "laplace",
                                  "bounded-laplace", "ogpm-unbiased", "pm-c", "sw-c", "ii-ptt"])
def test_goodness_of_fit_rejects_a_wrong_epsilon_or_input(kind):
    m = make(kind, 1.0, -2.0, 2.0)
    wrong_eps = make(kind, 1.25, -2.0, 2.0)
    rng = np.random.default_rng(SEED + 1)
    x = -1.0
    codes = m.perturb_codes(np.full(N, x), rng)
    cdf_wrong_eps = np.cumsum(wrong_eps.grid_pmf(x))
    cdf_wrong_x = np.cumsum(m.grid_pmf(x + 0.2))
    assert ks_statistic(codes, cdf_wrong_eps) > dkw_threshold(N)
    assert ks_statistic(codes, cdf_wrong_x) > dkw_threshold(N)


def test_perturb_reports_cell_centres_matching_codes():
    m = make("ogpm", 1.0, 0.0, 10.0)
    rng1, rng2 = np.random.default_rng(3), np.random.default_rng(3)
    values = m.perturb(np.linspace(0, 10, 1000).reshape(10, 100), rng1)
    codes = m.perturb_codes(np.linspace(0, 10, 1000).reshape(10, 100), rng2)
    assert values.shape == codes.shape == (10, 100)
    assert np.array_equal(m.to_codes(values), codes)
    assert np.array_equal(m.from_codes(codes), values)
    centres = m.output_low + (np.arange(m.n_cells) + 0.5) * m.cell_width
    assert np.isin(values, centres).all()
