"""Closed forms against the numbers in docs/guides/FIELD_NOTES.md and the papers' own
formulas."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from scipy import integrate

from edge_agent.mechanisms import (
    EPSILON_MIN,
    PTT,
    BoundedLaplace,
    CircularOGPM,
    ClassicalOGPM,
    Duchi,
    PiecewiseMechanism,
    PolarOGPM,
    SquareWave,
    TruncatedLaplace,
    TypeIIPTT,
    UnbiasedOGPM,
    fleet_polar_split,
    optimal_polar_split,
)
from edge_agent.mechanisms.ogpm import (
    unbiased_variance_unit,
    unit_vector_variance,
    worst_case_mse_unit,
)
from edge_agent.mechanisms.randomized_response import RandomizedResponse
from tests.edge_agent.mechanisms.helpers import KINDS, make
from tests.support import REPO

PI = math.pi


# -- Classical OGPM (Theorem 3.7, Example 3.8, App. B.5) ------------------------

def test_example_3_8_intervals_and_density():
    m = ClassicalOGPM(epsilon=1.0, low=0.0, high=1.0)
    assert m.p_high == pytest.approx(1.6487, abs=1e-4)
    assert m.p_low == pytest.approx(1.6487 / math.e, abs=1e-4)
    left, right = m.interval(0.0)
    assert (float(left), float(right)) == pytest.approx((0.0, 0.3775), abs=1e-4)
    left, right = m.interval(0.5)
    assert (float(left), float(right)) == pytest.approx((0.3113, 0.6887), abs=1e-4)
    left, right = m.interval(1.0)
    assert (float(left), float(right)) == pytest.approx((1 - 0.3775, 1.0), abs=1e-4)


def test_worst_case_mse_and_sw_comparison():
    assert ClassicalOGPM(epsilon=1.0, low=0, high=1).worst_case_error(2) == pytest.approx(
        0.22087, abs=5e-6)
    assert worst_case_mse_unit(1.0) == pytest.approx(0.22087, abs=5e-6)
    # App. B.5: "SW ... has an MSE of 0.29 at x = 0".
    assert float(SquareWave(epsilon=1.0, low=0, high=1).expected_error(0.0)) == pytest.approx(
        0.29, abs=0.005)


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 2.5, 6.0])
def test_appendix_b5_mse_formula_matches_pieces(epsilon):
    m = ClassicalOGPM(epsilon=epsilon, low=0.0, high=1.0)
    p, e, c = math.exp(epsilon / 2), math.exp(epsilon), m.half_width
    for x in np.linspace(0, 1, 41):
        if x < c:
            paper = (p / 3 * ((2 * c - x) ** 3 + x**3)
                     + p / (3 * e) * ((1 - x) ** 3 - (2 * c - x) ** 3))
        elif x <= 1 - c:
            paper = p / (3 * e) * (-2 * c**3 + 3 * x**2 - 3 * x + 1) + p / 3 * (2 * c**3)
        else:
            paper = p / (3 * e) * ((1 - 2 * c - x) ** 3 + x**3) + p / 3 * (
                (1 - x) ** 3 - (1 - 2 * c - x) ** 3)
        assert float(m.expected_error(x, 2)) == pytest.approx(paper, rel=1e-10)


def test_scaling_theorem_3_6():
    unit = ClassicalOGPM(epsilon=1.3, low=0, high=1)
    scaled = ClassicalOGPM(epsilon=1.3, low=-2.0, high=2.0)
    for x in np.linspace(0, 1, 11):
        assert float(scaled.expected_error(-2 + 4 * x, 2)) == pytest.approx(
            16 * float(unit.expected_error(x, 2)), rel=1e-10)
        assert float(scaled.mean_output(-2 + 4 * x)) == pytest.approx(
            -2 + 4 * float(unit.mean_output(x)), abs=1e-12)
    assert scaled.p_high == pytest.approx(unit.p_high / 4)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_classical_mean_is_affine_inside_and_invertible(epsilon):
    m = ClassicalOGPM(epsilon=epsilon, low=0.0, high=1.0)
    s = math.exp(epsilon / 2)
    xs = np.linspace(m.half_width, 1 - m.half_width, 25)
    assert np.allclose(m.mean_output(xs), (1 - 1 / s) * xs + 1 / (2 * s), atol=1e-12)
    assert np.allclose(m.bias_inverse(m.mean_output(xs)), xs, atol=1e-12)
    # Constant near the edges (the interval stops moving).
    edge = m.mean_output(np.linspace(0, m.half_width, 5))
    assert np.ptp(edge) < 1e-12


# -- Circular OGPM (Theorem 4.2, Example 4.3, Theorem 4.4) ---------------------

def test_example_4_3_arc_and_densities():
    m = CircularOGPM(epsilon=1.0)
    assert m.p_high == pytest.approx(0.2624, abs=1e-4)
    assert m.p_low == pytest.approx(0.0965, abs=1e-4)
    # High arc at x = 0: [1.6225 pi, 2 pi) U [0, 0.3775 pi).
    assert float(m.pdf(0.0, 0.3774 * PI)) == m.p_high
    assert float(m.pdf(0.0, 0.3776 * PI)) == m.p_low
    assert float(m.pdf(0.0, 1.6226 * PI)) == m.p_high
    assert float(m.pdf(0.0, 1.6224 * PI)) == m.p_low
    assert m.length / 2 == pytest.approx(0.3775 * PI, abs=1e-4 * PI)


@pytest.mark.parametrize("epsilon,mse", [(1.0, 2.17991), (2.0, 1.36069)])
def test_theorem_4_4_circular_mse(epsilon, mse):
    m = CircularOGPM(epsilon=epsilon)
    s, p = math.exp(epsilon / 2), math.exp(epsilon / 2) / (2 * PI)
    c = PI / (s + 1)
    paper = 2 / 3 * ((PI**3 - c**3) * p / math.exp(epsilon) + c**3 * p)
    assert paper == pytest.approx(mse, abs=5e-6)
    xs = np.linspace(0, 2 * PI, 17)
    assert np.allclose(m.expected_error(xs, 2), mse, atol=5e-6)
    assert m.worst_case_error(2) == pytest.approx(mse, abs=5e-6)
    assert np.allclose(m.variance(xs), mse, atol=5e-6)


@pytest.mark.parametrize("epsilon,rho", [(0.5, 0.1578), (1.0, 0.3075), (3.0, 0.7350)])
def test_resultant_shrink_factor(epsilon, rho):
    m = CircularOGPM(epsilon=epsilon)
    s = math.exp(epsilon / 2)
    assert m.mean_resultant_length() == pytest.approx(((s - 1 / s) / PI) * math.sin(PI / (s + 1)))
    assert m.mean_resultant_length() == pytest.approx(rho, abs=5e-5)
    # Same in degrees: the factor is unit free.
    assert CircularOGPM(epsilon=epsilon, period=360.0).mean_resultant_length() == pytest.approx(
        m.mean_resultant_length())


def test_resultant_shrink_factor_monte_carlo():
    m = CircularOGPM(epsilon=1.0)
    x = 2.0
    y = m.perturb(np.full(400_000, x), np.random.default_rng(11))
    mc = np.mean(np.cos(y - x))
    # sd of cos is below 0.75, so 6 standard errors is about 0.007.
    assert mc == pytest.approx(0.3075, abs=0.007)


# -- OGPM-U (Theorem 5.1) --------------------------------------------------------

@pytest.mark.parametrize("epsilon", [0.2, 1.0, 4.0])
@pytest.mark.parametrize("domain", [(0.0, 1.0), (-3.0, 7.0)])
def test_unbiased_ogpm_mean_is_x(epsilon, domain):
    m = UnbiasedOGPM(epsilon=epsilon, low=domain[0], high=domain[1])
    xs = np.linspace(*domain, 33)
    assert np.allclose(m.mean_output(xs), xs, atol=1e-9 * (domain[1] - domain[0]))


def test_unbiased_ogpm_pieces_match_theorem_5_1():
    eps = 1.0
    m = UnbiasedOGPM(epsilon=eps, low=0.0, high=1.0)
    s = math.exp(eps / 2)
    c = (s + 1) / (s - 1)
    assert (m.output_low, m.output_high) == pytest.approx((-c, 1 + c))
    assert m.p_high == pytest.approx(s / (2 * c + 1))
    for x in (0.0, 0.3, 1.0):
        left, right = m.interval(x)
        assert float(left) == pytest.approx((c + 1) / 2 * x - (3 * c + 1) * (c - 1) / (4 * c))
        assert float(right) == pytest.approx((c + 1) / 2 * x + (c + 1) * (c - 1) / (4 * c))
    assert m.length == pytest.approx((2 * c + 1) / (s + 1))


def test_unbiased_ogpm_empirical_mean():
    m = UnbiasedOGPM(epsilon=1.0, low=0.0, high=1.0)
    n = 400_000
    y = m.perturb(np.full(n, 0.1), np.random.default_rng(5))
    se = math.sqrt(float(m.variance(0.1)) / n)
    assert abs(y.mean() - 0.1) < 6 * se


# -- Polar split (Sec. 6, App. B.6) --------------------------------------------------

def test_polar_split_matches_notes():
    e1, e2 = optimal_polar_split(1 + 2 * PI, 1.0)
    assert e1 == pytest.approx(1.299, abs=0.01)
    assert e2 == pytest.approx(5.985, abs=0.01)
    m = PolarOGPM(epsilon=1 + 2 * PI, radius_max=1.0)
    assert (m.epsilon_radius, m.epsilon_angle) == (e1, e2)


@pytest.mark.parametrize("epsilon,radius_max,weight", [(1 + 2 * PI, 1.0, 1.0), (3.0, 2.0, 1.0),
                                                       (8.0, 0.5, 3.0), (2.0, 5.0, 0.1)])
def test_polar_split_minimises_objective_exactly(epsilon, radius_max, weight):
    e1, e2 = optimal_polar_split(epsilon, radius_max, weight=weight)
    objective = lambda a: weight * radius_max**2 * worst_case_mse_unit(a) + PI**2 * (  # noqa
        worst_case_mse_unit(epsilon - a))
    best = objective(e1)
    grid = np.linspace(0, epsilon, 20001)
    assert best <= min(objective(a) for a in grid) + 1e-12
    assert e1 + e2 <= epsilon
    # The sum of the two component MSEs is what the mechanism reports as worst case.
    m = PolarOGPM(epsilon=epsilon, radius_max=radius_max, weight=weight)
    assert m.worst_case_error(2) == pytest.approx(
        radius_max**2 * worst_case_mse_unit(e1) + PI**2 * worst_case_mse_unit(e2), rel=1e-9)


@pytest.mark.parametrize("weight,pinned", [
    (7.7627405667777065, 0.0),  # free optimum: 2.1e-12 for the radius
    (7.762771617732209, EPSILON_MIN),  # free optimum: 8.4e-6 for the radius
    (12.548236097779293, 1.0),  # free optimum: 8.4e-6 for the angle
])
def test_polar_split_is_optimal_among_shares_the_sampler_runs(weight, pinned):
    """Each share is 0 or >= EPSILON_MIN, and the split minimises the objective over those."""
    e1, e2 = optimal_polar_split(1.0, 1.0, weight=weight)
    small, large = sorted((e1, e2))
    assert small == (pinned if pinned < 0.5 else EPSILON_MIN)
    assert (e1 < e2) == (pinned < 0.5)
    # The other share is the largest float that composes to at most 1, exactly.
    assert Fraction(small) + Fraction(large) <= 1 < Fraction(small) + Fraction(
        math.nextafter(large, 2.0))
    objective = lambda a: weight * worst_case_mse_unit(a) + PI**2 * (  # noqa: E731
        worst_case_mse_unit(1.0 - a))
    allowed = [0.0, 1.0, *np.linspace(EPSILON_MIN, 1.0 - EPSILON_MIN, 20001),
               *np.linspace(EPSILON_MIN, 1e-4, 2001), *np.linspace(1.0 - 1e-4, 1.0 - EPSILON_MIN,
                                                                  2001)]
    assert objective(e1) <= min(objective(a) for a in allowed)
    m = PolarOGPM(epsilon=1.0, radius_max=1.0, weight=weight)
    assert (m.epsilon_radius, m.epsilon_angle) == (e1, e2)
    assert m.exact_privacy_loss().at_most(1.0)


def test_polar_split_boundary_gives_radius_no_budget():
    # Small epsilon and a unit radius: the angle's larger range takes everything.
    e1, e2 = optimal_polar_split(1.0, 1.0)
    assert (e1, e2) == (0.0, 1.0)
    m = PolarOGPM(epsilon=1.0, radius_max=1.0)
    pmf = m.radius_mechanism.grid_pmf(0.3)
    assert np.allclose(pmf, 1.0 / pmf.size)  # uniform: the radius says nothing
    assert m.privacy_loss() <= 1.0


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 4.0])
def test_the_fleet_split_variances_are_the_mechanisms_closed_forms(epsilon):
    """``unbiased_variance_unit`` is classical OGPM's Var[M(x)] / a² at its worst over the
    affine region (the mechanism's own closed form, on a fine grid), and
    ``unit_vector_variance`` is 1/ρ² - 1 with circular OGPM's own ρ."""
    m = ClassicalOGPM(epsilon=epsilon, low=0.0, high=1.0, grid_bits=16)
    a, _, lo, hi = m.affine_mean()
    worst = float(np.max(m.variance(np.linspace(lo, hi, 4097)))) / a**2
    assert unbiased_variance_unit(epsilon) == pytest.approx(worst, rel=1e-9)
    rho = CircularOGPM(epsilon=epsilon).mean_resultant_length()
    assert unit_vector_variance(epsilon) == pytest.approx(1 / rho**2 - 1, rel=1e-9)


@pytest.mark.parametrize("epsilon,weight", [(0.1, 1.0), (0.41, 1.0), (1.0, 0.05), (4.0, 1.0),
                                            (1 + 2 * PI, 20.0), (2 * EPSILON_MIN, 1.0)])
def test_the_fleet_split_minimises_the_means_variances_and_gives_both_a_share(epsilon, weight):
    """split = "fleet": weight x the radius mean's variance + the direction's (shares of
    their ranges) is least at the split, over a fine grid of the shares the sampler runs;
    both parts get at least EPSILON_MIN where the paper's split gives the radius
    nothing; the two compose to at most epsilon exactly; neither the radius's range nor
    the angle's unit moves it."""
    e1, e2 = fleet_polar_split(epsilon, 2.0, weight=weight)
    assert min(e1, e2) >= EPSILON_MIN
    assert Fraction(e1) + Fraction(e2) <= Fraction(epsilon)
    assert e1 + e2 == pytest.approx(epsilon, rel=1e-12)

    def objective(a):
        return weight * unbiased_variance_unit(a) + unit_vector_variance(epsilon - a) / (2 * PI)**2

    grid = np.linspace(EPSILON_MIN, epsilon - EPSILON_MIN, 20001)
    assert objective(e1) <= min(objective(a) for a in grid) * (1 + 1e-12)
    assert fleet_polar_split(epsilon, 0.1, weight=weight, period=360.0) == (e1, e2)
    if epsilon == 0.41:
        assert optimal_polar_split(epsilon, 2.0, weight=weight)[0] == 0.0  # the paper's
    m = PolarOGPM(epsilon=epsilon, radius_max=2.0, weight=weight, split="fleet")
    assert (m.epsilon_radius, m.epsilon_angle) == (e1, e2)
    assert m.exact_privacy_loss().at_most(epsilon)
    # more weight on the radius, more epsilon for it
    assert fleet_polar_split(epsilon, 2.0, weight=weight * 4)[0] >= e1


# -- Baselines against their papers --------------------------------------------------

def test_pm_densities_and_interval():
    eps = 1.5
    m = PiecewiseMechanism(epsilon=eps, low=-1.0, high=1.0)
    s = math.exp(eps / 2)
    c = (s + 1) / (s - 1)
    assert (m.output_low, m.output_high) == pytest.approx((-c, c))
    assert m.p_high == pytest.approx((math.exp(eps) - s) / (2 * s + 2))
    for x in (-1.0, 0.2, 1.0):
        left, right = m.interval(x)
        assert float(left) == pytest.approx((c + 1) / 2 * x - (c - 1) / 2)
        assert float(right - left) == pytest.approx(c - 1)
    assert np.allclose(m.mean_output(np.linspace(-1, 1, 9)), np.linspace(-1, 1, 9), atol=1e-12)


def test_sw_densities():
    eps = 2.0
    m = SquareWave(epsilon=eps, low=0.0, high=1.0)
    e = math.exp(eps)
    b = (eps * e - e + 1) / (2 * e * (e - 1 - eps))
    assert (m.output_low, m.output_high) == pytest.approx((-b, 1 + b))
    assert m.p_high == pytest.approx(e / (2 * b * e + 1))
    assert m.p_low == pytest.approx(1 / (2 * b * e + 1))


def test_compressed_variants_report_inside_domain():
    for cls in (PiecewiseMechanism, SquareWave):
        m = cls(epsilon=2.0, low=-1.0, high=3.0, compressed=True)
        assert (m.output_low, m.output_high) == (-1.0, 3.0)
        y = m.perturb(np.linspace(-1, 3, 1000), np.random.default_rng(0))
        assert y.min() >= -1.0 and y.max() <= 3.0


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0])
def test_ptt_variance_matches_optt_theorem_3(epsilon):
    m = PTT(epsilon=epsilon, low=-1.0, high=1.0)
    eta, k = m.eta, m.k
    # eta_0 is the root of eta**3 - 3 eta**2 - 2 (e**eps - 1) (OPTT Eq. A.2-A.4).
    assert eta**3 - 3 * eta**2 - 2 * math.expm1(epsilon) == pytest.approx(0, abs=1e-9)
    for x in (-1.0, -0.3, 0.0, 0.7, 1.0):
        paper = (k - 1) * x**2 + k / (3 * (eta - 1) ** 2) * (eta**3 / math.expm1(epsilon) + 1)
        assert float(m.variance(x)) == pytest.approx(paper, rel=1e-9)
        assert float(m.mean_output(x)) == pytest.approx(x, abs=1e-12)
    # Theorem 2's p and q.
    assert m.p_high == pytest.approx(math.exp(epsilon) / (2 * m.a * k * math.expm1(epsilon)))


def test_duchi_matches_lemma_2():
    eps = 0.8
    m = Duchi(epsilon=eps, low=-1.0, high=1.0)
    c = (math.exp(eps) + 1) / (math.exp(eps) - 1)
    assert (m.output_low, m.output_high) == pytest.approx((-c, c))
    for x in (-1.0, 0.0, 0.4, 1.0):
        assert float(m.mean_output(x)) == x
        assert float(m.variance(x)) == pytest.approx(c**2 - x**2)
        up = float(m.pdf(x, c))
        assert up == pytest.approx(0.5 + (math.exp(eps) - 1) / (2 * (math.exp(eps) + 1)) * x)
        assert up + float(m.pdf(x, -c)) == pytest.approx(1.0)


def test_bounded_laplace_fixes_the_appendix_b8_normaliser():
    eps = 2.0
    m = BoundedLaplace(epsilon=eps, low=0.0, high=1.0)

    def paper_b8_l1(x):  # the OGPM paper's App. B.8 closed form
        return (2 - (1 + eps * x) * math.exp(-eps * x)
                - (1 + eps * (1 - x)) * math.exp(-eps * (1 - x))) / (eps * (1 - math.exp(-eps)))

    for x in (0.0, 1.0):  # C(x) equals the paper's constant only at the ends
        assert float(m.expected_error(x, 1)) == pytest.approx(paper_b8_l1(x), rel=1e-10)
    # Inside, the paper's constant normaliser does not integrate to one ...
    paper_mass = integrate.quad(lambda y: eps / (1 - math.exp(-eps)) * math.exp(-eps * abs(y - .5)),
                                0, 1)[0]
    assert paper_mass > 1.05
    # ... ours does, so its error is smaller there by exactly that factor.
    assert float(m.expected_error(0.5, 1)) == pytest.approx(paper_b8_l1(0.5) / paper_mass, rel=1e-8)


def test_truncated_laplace_atoms():
    m = TruncatedLaplace(epsilon=1.0, low=0.0, high=2.0)
    lo, hi = m.boundary_masses(0.5)
    assert float(lo) == pytest.approx(0.5 * math.exp(-0.5 / 2.0))
    assert float(hi) == pytest.approx(0.5 * math.exp(-1.5 / 2.0))
    assert float(m.cdf(0.5, 0.0)) == pytest.approx(float(lo))
    assert float(1 - m.cdf(0.5, np.nextafter(2.0, 0))) == pytest.approx(float(hi), rel=1e-6)


# -- Every closed form against numerical integration of its own density ----------------

def _moments_by_quadrature(m, x):
    if isinstance(m, (Duchi, TypeIIPTT)):  # atoms: the pdf is their probability mass
        ys = m.from_codes(np.arange(m.n_cells))
        w = m.pdf(x, ys)
        return float(w.sum()), float((w * ys).sum()), float((w * (ys - x) ** 2).sum()), ys, w
    points = list(np.ravel(m.interval(x))) if hasattr(m, "interval") else [x]
    lo, hi = m.output_low, m.output_high

    def quad(f):
        return integrate.quad(f, lo, hi, points=[p for p in points if lo < p < hi], limit=200,
                              epsabs=1e-13, epsrel=1e-12)[0]

    mass = quad(lambda y: float(m.pdf(x, y)))
    mean = quad(lambda y: y * float(m.pdf(x, y)))
    mse = quad(lambda y: (y - x) ** 2 * float(m.pdf(x, y)))
    if isinstance(m, TruncatedLaplace):
        a_lo, a_hi = (float(v) for v in m.boundary_masses(x))
        mass += a_lo + a_hi
        mean += a_lo * m.low + a_hi * m.high
        mse += a_lo * (m.low - x) ** 2 + a_hi * (m.high - x) ** 2
    return mass, mean, mse, None, None


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "ogpm-circular"])
@pytest.mark.parametrize("epsilon", [0.4, 2.0, 7.0])
def test_closed_forms_equal_integrals_of_pdf(kind, epsilon):
    m = make(kind, epsilon, low=-1.0, high=3.0)
    for x in (-1.0, -0.2, 1.0, 2.9, 3.0):
        mass, mean, mse, _, _ = _moments_by_quadrature(m, x)
        assert mass == pytest.approx(1.0, abs=1e-9)
        assert float(m.mean_output(x)) == pytest.approx(mean, abs=1e-8)
        assert float(m.expected_error(x, 2)) == pytest.approx(mse, rel=1e-8, abs=1e-10)
        assert float(m.variance(x)) == pytest.approx(mse - (mean - x) ** 2, rel=1e-7, abs=1e-9)


@pytest.mark.parametrize("epsilon", [0.4, 2.0, 7.0])
def test_circular_closed_forms_equal_integrals(epsilon):
    m = CircularOGPM(epsilon=epsilon, period=360.0, origin=-180.0)
    for x in (-180.0, -3.0, 179.9):
        ends = [float(m.wrap(x - m.length / 2)), float(m.wrap(x + m.length / 2)), float(m.wrap(x))]
        kinks = [e for e in ends if -180 < e < 180]
        mass = integrate.quad(lambda y: float(m.pdf(x, y)), -180, 180, points=kinks, limit=200)[0]
        assert mass == pytest.approx(1.0, abs=1e-9)
        for p in (1, 2, 3):
            err = integrate.quad(lambda y: float(m.distance(x, y)) ** p * float(m.pdf(x, y)),
                                 -180, 180, points=kinks, limit=400, epsrel=1e-11)[0]
            assert float(m.expected_error(x, p)) == pytest.approx(err, rel=1e-8)
        grid = np.linspace(-180, 180, 9)
        cum = [integrate.quad(lambda y: float(m.pdf(x, y)), -180, g, limit=200,
                              points=[k for k in kinks if k < g] or None)[0] for g in grid]
        assert np.allclose(m.cdf(x, grid), cum, atol=1e-9)


@pytest.mark.parametrize("kind", [k for k in KINDS if k not in ("ogpm-circular", "duchi",
                                                                 "ii-ptt")])
def test_cdf_is_integral_of_pdf(kind):
    m = make(kind, 1.7, low=2.0, high=5.0)
    x = 2.3
    ys = np.linspace(m.output_low, m.output_high, 13)[1:-1]
    base = float(m.cdf(x, m.output_low))
    for y in ys:
        kinks = list(np.ravel(m.interval(x))) if hasattr(m, "interval") else [x]
        integral = integrate.quad(lambda t: float(m.pdf(x, t)), m.output_low, y, limit=200,
                                  points=[k for k in kinks if m.output_low < k < y] or None,
                                  epsabs=1e-13)[0]
        assert float(m.cdf(x, y)) == pytest.approx(base + integral, abs=1e-9)


@pytest.mark.parametrize("kind", ["ogpm", "ogpm-unbiased", "pm", "pm-c", "sw", "sw-c", "ptt",
                                  "ii-ptt"])
def test_piecewise_worst_case_is_at_an_end(kind):
    # OGPM paper Lemma 3.2: the worst case of a GPM is at an end of the domain.
    m = make(kind, 1.3, low=0.0, high=1.0)
    for p in (1, 2):
        ends = max(float(m.expected_error(0.0, p)), float(m.expected_error(1.0, p)))
        assert m.worst_case_error(p) == pytest.approx(ends, rel=1e-12)


def test_truncated_laplace_worst_case_is_inside():
    # Sec. 7.1.3: clamping favours the ends, so T-Laplace's worst case is in the middle.
    m = TruncatedLaplace(epsilon=2.0, low=0.0, high=1.0)
    assert m.worst_case_error(1) > float(m.expected_error(0.0, 1)) + 0.01
    assert m.worst_case_error(1) == pytest.approx(float(m.expected_error(0.5, 1)), rel=1e-9)


@pytest.mark.parametrize("epsilon", [0.3, 1.0, 4.0])
def test_pm_c_coincides_with_ogpm_at_the_ends(epsilon):
    """Compressed PM's central piece at x = low is [low, low + w/(s+1)), OGPM's exactly.

    So the two have the same worst-case error (the OGPM paper's Fig. 9 shows a
    gap).  Both pieces also have length w/(s+1) and coincide at the middle;
    in between, PM-C's piece moves at a different speed and OGPM is strictly
    better (the paper's Fig. 8).
    """
    ogpm = ClassicalOGPM(epsilon=epsilon, low=0.0, high=1.0)
    pmc = PiecewiseMechanism(epsilon=epsilon, low=0.0, high=1.0, compressed=True)
    for x in (0.0, 1.0):
        assert np.allclose(ogpm.interval(x), pmc.interval(x), atol=1e-15)
        assert float(ogpm.expected_error(x)) == pytest.approx(float(pmc.expected_error(x)))
    assert float(ogpm.expected_error(0.5)) == pytest.approx(float(pmc.expected_error(0.5)))
    inside = np.concatenate([np.linspace(0.02, 0.45, 12), np.linspace(0.55, 0.98, 12)])
    assert np.all(ogpm.expected_error(inside) < pmc.expected_error(inside))


@pytest.mark.parametrize("kind", ["ogpm", "ogpm-unbiased", "pm", "pm-c", "sw", "sw-c", "ptt",
                                  "duchi", "ii-ptt"])
@pytest.mark.parametrize("epsilon", [0.5, 1.0, 2.0, 4.0, 6.0])
def test_affine_mean_region_is_exact_and_maximal(kind, epsilon):
    m = make(kind, epsilon, low=-1.0, high=3.0)
    a, b, lo, hi = m.affine_mean()
    inside = np.linspace(lo, hi, 101)
    assert np.allclose(m.mean_output(inside), a * inside + b, atol=1e-12)
    if kind == "ogpm":  # the clamp binds exactly outside [low + C, high - C]
        assert (lo, hi) == pytest.approx((-1.0 + m.half_width, 3.0 - m.half_width))
        outside = np.array([-1.0, 3.0])
        assert np.all(np.abs(m.mean_output(outside) - (a * outside + b)) > 1e-6)
    else:  # exactly: a flat end of rounding's width (PM-C at eps 1, 2, 4) is one to a
        # collector, which then notes data near it and widens its bias bound
        assert (lo, hi) == (-1.0, 3.0)
    if m.unbiased:
        assert (a, b) == pytest.approx((1.0, 0.0), abs=1e-12)


def test_laplace_and_circular_means_are_not_affine():
    assert make("laplace", 1.0).affine_mean() is None
    assert make("bounded-laplace", 1.0).affine_mean() is None
    assert make("ogpm-circular", 1.0).affine_mean() is None


# -- Randomized response as docs/reference/PROTOCOL.md describes it --------------------------------

def test_protocol_doc_gives_the_keep_and_flip_probabilities_of_the_code():
    text = " ".join((REPO / "docs" / "reference" / "PROTOCOL.md").read_text().split())
    assert "kept with probability p = K/2^53, about e^ε/(1+e^ε)" in text
    assert "flipped with probability F/2^53 = 1 − p, about 1/(1+e^ε)" in text
    for epsilon in (0.1, 1.0, 6.0):
        rr = RandomizedResponse(epsilon=epsilon)
        total = rr.keep_weight + rr.flip_weight
        assert total == 2**53 and rr.keep_probability == Fraction(rr.keep_weight, total)
        e = math.exp(epsilon)
        assert float(rr.keep_probability) == pytest.approx(e / (1 + e), rel=1e-15)
        assert float(rr.pmf(-1, 1)) == pytest.approx(1 / (1 + e), rel=1e-14)
