"""Parameter validation, input handling, codes, descriptions and randomness sources."""

from __future__ import annotations

import math
import pickle
from itertools import product

import numpy as np
import pytest

from edge_agent.mechanisms import (
    EPSILON_MIN,
    PTT,
    BoundedLaplace,
    CircularOGPM,
    ClassicalOGPM,
    Duchi,
    PiecewiseMechanism,
    PolarOGPM,
    SeededRandom,
    SquareWave,
    SystemRandom,
    TruncatedLaplace,
    TypeIIPTT,
    UnbiasedOGPM,
    from_description,
)
from edge_agent.mechanisms.randomized_response import RandomizedResponse
from edge_agent.mechanisms.randomness import as_random_source
from tests.edge_agent.mechanisms.helpers import KINDS, PURE_KINDS, make

LINEAR = [ClassicalOGPM, UnbiasedOGPM, PiecewiseMechanism, SquareWave, PTT, Duchi,
          TruncatedLaplace, BoundedLaplace, TypeIIPTT]


# -- constructor errors -------------------------------------------------------------

@pytest.mark.parametrize("cls", LINEAR)
@pytest.mark.parametrize("epsilon,message", [
    (0.0, r"epsilon: must be in \[1e-05, 20\], got 0"),
    (-1.0, r"epsilon: must be in \[1e-05, 20\], got -1"),
    (1e-12, r"epsilon: must be in \[1e-05, 20\], got 1e-12"),
    (np.nextafter(EPSILON_MIN, 0.0), r"epsilon: must be in \[1e-05, 20\], got 1e-05"),
    (25.0, r"epsilon: must be in \[1e-05, 20\], got 25"),
    (math.inf, "epsilon must be finite"),
    (math.nan, "epsilon must be finite"),
])
def test_bad_epsilon_names_the_range(cls, epsilon, message):
    with pytest.raises(ValueError, match=message):
        cls(epsilon=epsilon, low=0.0, high=1.0)


def test_circle_polar_and_response_refuse_epsilon_below_the_minimum():
    with pytest.raises(ValueError, match=r"epsilon: must be in \[1e-05, 20\], got 1e-12"):
        CircularOGPM(epsilon=1e-12)
    with pytest.raises(ValueError, match=r"epsilon: must be in \[1e-05, 20\], got 1e-12"):
        PolarOGPM(epsilon=1e-12, radius_max=1.0)
    # Randomized response takes range discovery's per-round shares (down to 1e-9).
    assert RandomizedResponse(epsilon=EPSILON_MIN / 64).epsilon == EPSILON_MIN / 64
    with pytest.raises(ValueError, match=r"epsilon: must be in \[1e-09, 20\], got 1e-12"):
        RandomizedResponse(epsilon=1e-12)


# Every domain the tests below use at EPSILON_MIN: unit, wide, narrow far from zero, tiny.
MIN_EPSILON_DOMAINS = [(0.0, 1.0), (-1e6, 3e6), (1000.0, 1000.5), (-1e-90, 1e-90),
                       (-1e290, 1e290)]


@pytest.mark.parametrize("kind", PURE_KINDS)
def test_every_mechanism_runs_at_epsilon_min(kind):
    """The integer layouts, Duchi's atoms and the Laplace scale all exist at EPSILON_MIN
    (Opt-GM's noise does not fit a grid there: test_gaussian.py)."""
    rng = np.random.default_rng(12)
    for (low, high), bits in product(MIN_EPSILON_DOMAINS, (1, 2, 8, 16)):
        if kind == "duchi" and bits != 16:
            continue
        m = make(kind, EPSILON_MIN, low, high, grid_bits=bits)
        assert m.exact_privacy_loss().at_most(EPSILON_MIN), (kind, low, high, bits)
        x = np.array([low, high, 0.5 * low + 0.5 * high])
        codes = m.perturb_codes(x, rng)
        assert codes.shape == (3,) and int(codes.max()) < m.n_cells
        # ... and the kernel's codes are ones grid_pmf gives a positive probability.
        assert np.all(m.grid_pmf(x)[np.arange(3), codes] > 0.0)


def test_polar_and_response_run_at_epsilon_min():
    rng = np.random.default_rng(13)
    for bits, weight in product((1, 8, 16), (1e-6, 1.0, 1e6)):
        m = PolarOGPM(epsilon=EPSILON_MIN, radius_max=2.0, weight=weight, grid_bits=bits)
        assert m.exact_privacy_loss().at_most(EPSILON_MIN)
        r, a = m.perturb([0.0, 1.0, 2.0], [0.0, 1.0, 6.0], rng)
        assert r.shape == a.shape == (3,)
    rr = RandomizedResponse(epsilon=EPSILON_MIN)
    assert rr.exact_privacy_loss().at_most(EPSILON_MIN)
    assert rr.keep_weight > rr.flip_weight and math.isfinite(rr.debias_factor)
    assert set(rr.respond(np.array([1, -1, 1]), rng).tolist()) <= {-1, 1}


@pytest.mark.parametrize("cls", LINEAR)
def test_bad_domain_and_types(cls):
    with pytest.raises(ValueError, match="need low < high, got low=1, high=1"):
        cls(epsilon=1.0, low=1.0, high=1.0)
    with pytest.raises(ValueError, match="low < high"):
        cls(epsilon=1.0, low=2.0, high=1.0)
    with pytest.raises(TypeError, match="epsilon must be a real number, got str"):
        cls(epsilon="1", low=0.0, high=1.0)
    with pytest.raises(TypeError, match="got bool"):
        cls(epsilon=True, low=0.0, high=1.0)
    with pytest.raises(TypeError, match="low must be a real number"):
        cls(epsilon=1.0, low=None, high=1.0)
    with pytest.raises(TypeError):  # keyword-only
        cls(1.0, 0.0, 1.0)


LINEAR_KINDS = [kind for kind in KINDS if kind != "ogpm-circular"]
NARROW = r"low, high: the width must be at least 1e-100 and 2\*\*-32 times the largest magnitude"


@pytest.mark.parametrize("kind", LINEAR_KINDS)
@pytest.mark.parametrize("low,high", [
    (0.0, 5e-324),  # a subnormal width: 2**20 / width overflows, Duchi's pmf was not one
    (0.0, 1e-310),
    (2.2250738585072014e-308, 2.225073858507202e-308),  # normal ends, subnormal width
    (0.0, 1e-101),  # below WIDTH_MIN
    (1.0, 1.0 + 2.0**-40),  # 2**12 doubles for 2**20 ticks
    (-1e6, -1e6 + 1e-5),
])
def test_too_narrow_domains_are_refused(kind, low, high):
    with pytest.raises(ValueError, match=NARROW):
        make(kind, 1.0, low, high)


@pytest.mark.parametrize("kind", LINEAR_KINDS)
@pytest.mark.parametrize("epsilon", [EPSILON_MIN, 1.0, 20.0])
def test_domains_near_the_float_limit_are_refused_or_finite(kind, epsilon):
    if kind not in PURE_KINDS and epsilon == EPSILON_MIN:
        pytest.skip("Opt-GM refuses EPSILON_MIN on any grid (test_gaussian.py)")
    """Near +-1.8e308 the output domain (or density, or Laplace scale) of most mechanisms
    overflows: refused, naming the domain; the ones accepted are finite throughout."""
    rng = np.random.default_rng(14)
    with pytest.raises(ValueError, match=r"low, high: the width overflows, got \[-1e\+308, "):
        make(kind, epsilon, -1e308, 1e308)
    for low, high in [(-8e307, 8e307), (0.0, 1.7e308), (-1e300, 1e300), (-1e290, 1e290)]:
        try:
            m = make(kind, epsilon, low, high)
        except ValueError as exc:
            assert str(exc).startswith(
                f"low, high: [{low:g}, {high:g}] is too wide at epsilon={epsilon:g}: "), exc
            continue
        derived = [m.output_low, m.output_high, m.output_high - m.output_low, m.cell_width,
                   *m.grid_values, getattr(m, "p_high", 1.0), getattr(m, "scale", 1.0)]
        assert all(math.isfinite(v) for v in derived), (kind, low, high)
        x = np.array([low, high, 0.5 * low + 0.5 * high])
        codes = m.perturb_codes(x, rng)
        pmf = m.grid_pmf(x)
        assert np.allclose(pmf.sum(axis=-1), 1.0, rtol=0, atol=1e-12)
        assert np.all(pmf[np.arange(3), codes] > 0.0)
        assert np.all(np.isfinite(m.from_codes(codes)))
    # The widest domains at EPSILON_MIN that every one of them takes.
    make(kind, epsilon, -1e290, 1e290)


def test_circle_polar_and_grid_errors():
    with pytest.raises(ValueError, match="period: must be > 0, got 0"):
        CircularOGPM(epsilon=1.0, period=0.0)
    with pytest.raises(ValueError, match="period: must be > 0, got -360"):
        CircularOGPM(epsilon=1.0, period=-360.0)
    with pytest.raises(ValueError, match="radius_max: must be > 0, got 0"):
        PolarOGPM(epsilon=1.0, radius_max=0.0)
    # The width rule of linear domains, for a turn and a radius too.
    with pytest.raises(ValueError, match="period: the width must be at least 1e-100"):
        CircularOGPM(epsilon=1.0, period=5e-324)
    with pytest.raises(ValueError, match=r"period: the width must .* got 1 \(origin=1e\+12\)"):
        CircularOGPM(epsilon=1.0, period=1.0, origin=1e12)
    with pytest.raises(ValueError, match="origin, period: origin \\+ period overflows"):
        CircularOGPM(epsilon=1.0, period=1e308, origin=1e308)
    with pytest.raises(ValueError, match="radius_max: the width must be at least 1e-100"):
        PolarOGPM(epsilon=1.0, radius_max=1e-200)
    with pytest.raises(ValueError, match="period: the width must be at least 1e-100"):
        PolarOGPM(epsilon=1.0, radius_max=1.0, period=1e-310)
    with pytest.raises(ValueError, match="weight: must be > 0, got -1"):
        PolarOGPM(epsilon=1.0, radius_max=1.0, weight=-1.0)
    with pytest.raises(ValueError, match=r"grid_bits: must be in \[1, 16\], got 20"):
        ClassicalOGPM(epsilon=1.0, low=0, high=1, grid_bits=20)
    with pytest.raises(TypeError, match="grid_bits must be an integer, got float"):
        ClassicalOGPM(epsilon=1.0, low=0, high=1, grid_bits=16.0)
    with pytest.raises(TypeError, match="compressed must be a bool"):
        PiecewiseMechanism(epsilon=1.0, low=0, high=1, compressed=1)
    with pytest.raises(ValueError, match="p: must be an integer >= 1, got 0"):
        ClassicalOGPM(epsilon=1.0, low=0, high=1).expected_error(0.5, 0)


# -- inputs ------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_nan_and_inf_raise_and_name_the_count(kind):
    m = make(kind, 1.0)
    with pytest.raises(ValueError, match="values: 2 of 4 values are NaN or infinite"):
        m.perturb(np.array([0.1, np.nan, 0.5, np.inf]))
    with pytest.raises(TypeError, match="values must be numeric"):
        m.perturb(["a", "b"])


@pytest.mark.parametrize("kind", [k for k in KINDS if k != "ogpm-circular"])
def test_out_of_range_values_are_clipped_and_counted(kind):
    m = make(kind, 1.0, 0.0, 1.0)
    rng1, rng2 = np.random.default_rng(4), np.random.default_rng(4)
    codes, clipped = m.perturb_codes(np.array([-5.0, 0.0, 1.0, 7.0, 0.3]), rng1,
                                     return_clipped=True)
    assert clipped == 2
    same = m.perturb_codes(np.array([0.0, 0.0, 1.0, 1.0, 0.3]), rng2)
    assert np.array_equal(codes, same)


def test_circular_values_are_wrapped():
    m = CircularOGPM(epsilon=2.0)
    rng1, rng2 = np.random.default_rng(4), np.random.default_rng(4)
    a, wrapped = m.perturb_codes(np.array([-0.5, 7.0, 1.0 + 4 * math.pi]), rng1,
                                 return_clipped=True)
    b = m.perturb_codes(np.array([2 * math.pi - 0.5, 7.0 - 2 * math.pi, 1.0]), rng2)
    assert wrapped == 3
    assert np.array_equal(a, b)


@pytest.mark.parametrize("kind", KINDS)
def test_shapes_and_scalars(kind):
    m = make(kind, 1.0)
    assert m.perturb(0.5).shape == ()
    assert m.perturb(np.zeros((3, 4, 2)) + 0.5).shape == (3, 4, 2)
    assert m.perturb([]).shape == (0,)


def test_polar_perturb_and_codes():
    m = PolarOGPM(epsilon=4.0, radius_max=2.0, period=360.0, origin=-180.0)
    r, a = m.perturb(np.array([0.0, 1.0, 5.0]), np.array([-180.0, 0.0, 400.0]),
                     np.random.default_rng(0))
    assert r.shape == a.shape == (3,)
    assert np.all((r >= 0) & (r <= 2)) and np.all((a >= -180) & (a < 180))
    codes = m.to_codes(r, a)
    assert all(np.array_equal(x, y) for x, y in zip(m.from_codes(*codes), (r, a)))
    (_, _), clipped = m.perturb_codes([5.0], [400.0], return_clipped=True)
    assert clipped == 2
    with pytest.raises(ValueError, match="shapes differ"):
        m.perturb([1.0, 2.0], [0.0])


# -- codes -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_codes_round_trip_and_reject_out_of_grid(kind):
    m = make(kind, 2.0, -1.0, 1.0, grid_bits=8)
    y = m.perturb(np.linspace(-1, 1, 500), np.random.default_rng(1))
    codes = m.to_codes(y)
    assert codes.dtype == np.uint32 and codes.max() < m.n_cells
    assert np.array_equal(m.from_codes(codes), y)
    with pytest.raises(ValueError, match="codes must be in"):
        m.from_codes([m.n_cells])
    with pytest.raises(ValueError, match="codes must be in"):
        m.from_codes([-1])
    with pytest.raises(TypeError, match="codes must be integers"):
        m.from_codes([0.5])


def test_duchi_reports_exact_atoms():
    m = Duchi(epsilon=1.0, low=0.0, high=10.0)
    y = m.perturb(np.linspace(0, 10, 100), np.random.default_rng(0))
    assert set(np.unique(y)) <= {m.output_low, m.output_high}
    with pytest.raises(ValueError, match="Duchi reports are exactly"):
        m.to_codes([0.3])


# -- descriptions ------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_describe_round_trips_and_pickles(kind):
    m = make(kind, 1.5, -2.0, 3.0, grid_bits=12 if kind != "duchi" else 16)
    again = from_description(m.describe())
    assert again == m and hash(again) == hash(m)
    assert pickle.loads(pickle.dumps(m)) == m
    x = np.linspace(-2, 3, 7)
    assert np.array_equal(again.grid_pmf(x), m.grid_pmf(x))


def test_polar_describe_round_trips_and_checks_the_split():
    m = PolarOGPM(epsilon=3.0, radius_max=2.0)
    assert from_description(m.describe()) == m
    assert "split" not in m.describe()  # the paper's split: as every earlier release said
    tampered = {**m.describe(), "epsilon_radius": 2.9}
    with pytest.raises(ValueError, match="epsilon_radius=2.9 does not match"):
        from_description(tampered)
    fleet = PolarOGPM(epsilon=0.5, radius_max=2.0, split="fleet")
    assert fleet.describe()["split"] == "fleet" and from_description(fleet.describe()) == fleet
    assert fleet.epsilon_radius > 0 and PolarOGPM(epsilon=0.5, radius_max=2.0).epsilon_radius == 0
    with pytest.raises(ValueError, match="split: must be one of report, fleet"):
        PolarOGPM(epsilon=0.5, radius_max=2.0, split="even")
    with pytest.raises(TypeError, match="split must be a str"):
        PolarOGPM(epsilon=0.5, radius_max=2.0, split=1)


def test_from_description_errors():
    with pytest.raises(ValueError, match="unknown mechanism 'gauss'"):
        from_description({"name": "gauss", "epsilon": 1.0})
    with pytest.raises(ValueError, match="bad parameters for ogpm"):
        from_description({"name": "ogpm", "epsilon": 1.0, "low": 0, "high": 1, "colour": 3})
    with pytest.raises(ValueError, match="epsilon: must be in"):
        from_description({"name": "ogpm", "epsilon": -1.0, "low": 0, "high": 1})


# -- randomness --------------------------------------------------------------------

def test_default_randomness_is_the_csprng():
    source = as_random_source(None)
    assert isinstance(source, SystemRandom) and source.cryptographic
    words = source.words(100_000)
    assert words.dtype == np.uint64 and words.size == 100_000
    # Uniform bits: each of the 64 bit positions is set about half the time.
    bits = np.unpackbits(words.view(np.uint8)).reshape(-1, 64).mean(axis=0)
    assert np.all(np.abs(bits - 0.5) < 0.01)
    assert len(np.unique(words)) == words.size
    big = source.words((1 << 21) + 3)  # crosses the chunking boundary
    assert big.size == (1 << 21) + 3 and len(np.unique(big[-1000:])) == 1000


def test_default_perturb_differs_between_calls_and_seeded_repeats():
    m = ClassicalOGPM(epsilon=1.0, low=0.0, high=1.0)
    x = np.full(1000, 0.5)
    assert not np.array_equal(m.perturb_codes(x), m.perturb_codes(x))
    a = m.perturb_codes(x, np.random.default_rng(42))
    b = m.perturb_codes(x, np.random.default_rng(42))
    assert np.array_equal(a, b)


def test_seeded_source_handles_32_bit_generators():
    source = SeededRandom(np.random.Generator(np.random.MT19937(1)))
    words = source.words(50_000)
    assert (words >> np.uint64(32)).max() > 0  # full 64-bit words, not MT's 32-bit raw output
    with pytest.raises(TypeError, match="rng must be None"):
        as_random_source(42)
    with pytest.raises(TypeError, match="numpy.random.Generator"):
        SeededRandom(np.random.RandomState(1))
