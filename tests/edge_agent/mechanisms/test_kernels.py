"""Every kernel against the slow per-sample reference in ``reference.py``."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from edge_agent.mechanisms import (
    BoundedLaplace,
    Duchi,
    SeededRandom,
    TruncatedLaplace,
    _kernels,
)
from tests.edge_agent.mechanisms import reference
from tests.edge_agent.mechanisms.helpers import make


class ListSource:
    """A RandomSource that replays one fixed word stream, in order."""

    def __init__(self, words):
        self.words_all = np.asarray(words, dtype=np.uint64)
        self.pos = 0

    def words(self, count):
        chunk = self.words_all[self.pos:self.pos + count]
        if chunk.size < count:
            raise AssertionError("test stream exhausted")
        self.pos += count
        return chunk.copy()


def _inputs(m, rng, n=3000):
    w = m.high - m.low
    special = [m.low, m.high, m.low - 5 * w, m.high + 5 * w, np.nextafter(m.low, -np.inf),
               np.nextafter(m.high, np.inf), m.low + w / 2]
    return np.concatenate([special, rng.uniform(m.low - 0.2 * w, m.high + 0.2 * w, n)])


def _adversarial_words(rng, n, layout):
    """Random words plus words on the layer boundary and at the extremes."""
    words = rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
    shift = np.uint64(11)
    boundary = np.uint64(layout.base_total) << shift
    specials = [0, np.iinfo(np.uint64).max, int(boundary), int(boundary) - 1, int(boundary) + 1]
    words[: len(specials)] = np.array(specials, dtype=np.uint64)
    # Words at every multiple of the extra weight test the exact-division correction.
    k = min(200, n - len(specials))
    hits = layout.base_total + layout.extra_weight * rng.integers(0, layout.length, k)
    words[len(specials):len(specials) + k] = (hits.astype(np.uint64) << shift)
    rng.shuffle(words)
    return words


@pytest.mark.parametrize("kind", ["ogpm", "ogpm-unbiased", "pm", "pm-c", "sw", "sw-c", "ptt"])
@pytest.mark.parametrize("epsilon", [0.05, 1.0, 9.0])
def test_linear_tpm_kernel_matches_reference(kind, epsilon):
    rng = np.random.default_rng(7)
    m = make(kind, epsilon, -3.0, 5.0)
    x = _inputs(m, rng)
    words = _adversarial_words(rng, x.size, m.layout)
    codes, clipped = m.perturb_codes(x, ListSource(words), return_clipped=True)
    expected = [reference.tpm_code(m.layout, reference.tpm_linear_left(m, float(v)), int(w), False)
                for v, w in zip(x, words)]
    assert codes.tolist() == expected
    assert clipped == int(np.sum((x < m.low) | (x > m.high)))
    # start_ticks (used by grid_pmf) is the kernel's own start, value by value.
    assert m.start_ticks(x).tolist() == [reference.tpm_linear_left(m, float(v)) for v in x]


# Angles whose (x - origin) * 2**20 / period overflows or keeps no fraction of a turn.
HUGE_ANGLES = [1e300, -1e300, 1e308, -1.7e308, np.finfo(np.float64).max, 1e20, -3e15]


@pytest.mark.parametrize("epsilon", [0.05, 1.0, 9.0])
@pytest.mark.parametrize("period,origin", [(2 * np.pi, 0.0), (360.0, -180.0)])
def test_circular_kernel_matches_reference(epsilon, period, origin):
    from edge_agent.mechanisms import CircularOGPM

    rng = np.random.default_rng(8)
    m = CircularOGPM(epsilon=epsilon, period=period, origin=origin)
    x = np.concatenate([[origin, origin + period, np.nextafter(origin, -1e9), -1e7, 1e7],
                        HUGE_ANGLES, rng.uniform(origin - 3 * period, origin + 3 * period, 3000)])
    words = _adversarial_words(rng, x.size, m.layout)
    codes, wrapped = m.perturb_codes(x, ListSource(words), return_clipped=True)
    expected = [reference.tpm_code(m.layout, reference.tpm_circular_left(m, float(v)), int(w), True)
                for v, w in zip(x, words)]
    assert codes.tolist() == expected
    assert wrapped == int(np.sum((x < origin) | (x >= origin + period)))
    assert m.start_ticks(x).tolist() == [reference.tpm_circular_left(m, float(v)) for v in x]


@pytest.mark.parametrize("period,origin", [(2 * np.pi, 0.0), (360.0, -180.0), (1.0, 0.25)])
def test_huge_angles_wrap_to_their_exact_remainder(period, origin):
    """The kernel and grid_pmf wrap a huge angle to where it lies on the circle: the start
    tick of its exact remainder (Fraction arithmetic), to within the one rounding of the
    remainder's difference with the origin's."""
    from edge_agent.mechanisms import CircularOGPM

    m = CircularOGPM(epsilon=1.0, period=period, origin=origin)
    ticks = m.layout.ticks
    for x in HUGE_ANGLES:
        exact = (Fraction(x) - Fraction(origin)) % Fraction(period)
        start = int(m.start_ticks(x))
        ideal = math.floor(exact * Fraction(ticks) / Fraction(period) + Fraction(m._tick_offset))
        assert min((start - ideal) % ticks, (ideal - start) % ticks) <= 1, x
        if origin == 0.0:  # one remainder only: exact
            assert np.array_equal(m.grid_pmf(x), m.grid_pmf(float(exact)))
        assert m.start_ticks(x) == reference.tpm_circular_left(m, x)
        assert m.wrap(x) == pytest.approx(origin + float(exact), abs=1e-12 * period)


def test_duchi_kernel_matches_reference():
    rng = np.random.default_rng(9)
    m = Duchi(epsilon=0.7, low=-1.0, high=1.0)
    x = _inputs(m, rng)
    words = _adversarial_words(rng, x.size, m.layout)
    codes = m.perturb_codes(x, ListSource(words))
    expected = [reference.tpm_code(m.layout, reference.duchi_left(m, float(v)), int(w), False)
                for v, w in zip(x, words)]
    assert codes.tolist() == expected


def _tent_words(rng, n, m):
    """Random words plus words at the floor's and the tent's edges and the extremes."""
    words = rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
    flat = m.ticks * m.floor
    edges = [0, flat - 1, flat, flat + 1, m.total - 1, m.total, (1 << 53) - 1,
             flat + m.slope * (m.half ** 2 - 1), flat + m.slope - 1, flat + m.slope]
    specials = [int(v) << 11 for v in edges] + [np.iinfo(np.uint64).max]
    words[:len(specials)] = np.array(specials, dtype=np.uint64)
    rng.shuffle(words)
    return words


@pytest.mark.parametrize("epsilon,grid_bits", [(0.05, 8), (1.0, 16), (1.0, 1), (4.0, 3),
                                               (9.0, 12), (20.0, 8)])
def test_tent_kernel_matches_reference(epsilon, grid_bits):
    rng = np.random.default_rng(16)
    m = make("ii-ptt", epsilon, -3.0, 5.0, grid_bits=grid_bits)
    x = _inputs(m, rng)
    words = _tent_words(rng, 3 * x.size + 100, m)
    codes, clipped = m.perturb_codes(x, ListSource(words), return_clipped=True)
    stream = reference.WordStream(words)
    assert codes.tolist() == [reference.tent_code(m, float(v), stream) for v in x]
    assert clipped == int(np.sum((x < m.low) | (x > m.high)))
    # The closed forms' centre is the kernel's, value by value.
    centre, up = m._centre(x)
    assert list(zip(centre.tolist(), up.tolist())) == [
        (c, float(u)) for c, u in (reference.tent_centre(m, float(v)) for v in x)]


def test_tent_refills_resume_where_the_words_ran_out():
    """A source handing out three words at a time: every value that ran out resumes on
    the words it had not read, so the codes are those of one long stream (a value
    restarted on fresh words would favour the floor, which takes one word to the tent's
    two)."""
    m = make("ii-ptt", 1.0, 0.0, 1.0, grid_bits=8)
    x = np.random.default_rng(17).uniform(0.0, 1.0, 2000)
    stream = SeededRandom(np.random.default_rng(18)).words(10_000)

    class Dribble(ListSource):
        def words(self, count):
            return super().words(min(count, 3))

    whole = m.perturb_codes(x, ListSource(stream))
    assert m.perturb_codes(x, Dribble(stream)).tolist() == whole.tolist()


@pytest.mark.parametrize("kind", ["laplace", "bounded-laplace"])
@pytest.mark.parametrize("epsilon,grid_bits", [(0.5, 6), (3.0, 16), (12.0, 10)])
def test_laplace_kernel_matches_reference(kind, epsilon, grid_bits):
    rng = np.random.default_rng(10)
    m = make(kind, epsilon, 0.0, 1.0, grid_bits=grid_bits)
    x = _inputs(m, rng, n=1500)
    stream = rng.integers(0, np.iinfo(np.uint64).max, size=200_000, dtype=np.uint64,
                          endpoint=True)
    codes = m.perturb_codes(x, ListSource(stream))
    ref_stream = reference.WordStream(stream)
    expected = [reference.laplace_code(m, float(v), ref_stream) for v in x]
    assert codes.tolist() == expected


def test_laplace_refill_replays_the_unfinished_value():
    """A tiny first buffer forces many refills; the codes must not change."""
    m = TruncatedLaplace(epsilon=1.0, low=0.0, high=1.0, grid_bits=8)
    cells = np.arange(256, dtype=np.int64)
    stream = np.random.default_rng(11).integers(0, 2**63, size=100_000, dtype=np.int64)
    stream = stream.astype(np.uint64)
    whole = np.empty(256, dtype=np.uint32)
    done, _ = _kernels._laplace_cells(cells, stream, whole, 0, m._num, 16, 256, False)
    assert done == 256

    class Dribble(ListSource):
        def words(self, count):
            return super().words(min(count, 3))  # far too few each time

    pieces = _kernels.laplace_cells(cells, Dribble(stream), num=m._num, den_shift=16,
                                    n_cells=256, bounded=False)
    assert pieces.tolist() == whole.tolist()


def test_laplace_refills_grow_with_a_long_value():
    """Bounded Laplace keeps about epsilon / 2 of its draws, so one value at a small
    epsilon takes thousands of words; each refill replays the value, so refills must
    grow geometrically (at 1e-4 a value took 17 s with fixed 68-word refills)."""
    m = BoundedLaplace(epsilon=1e-3, low=0.0, high=1.0, grid_bits=16)
    inner = SeededRandom(np.random.default_rng(15))
    sizes = []

    class Counting:
        def words(self, count):
            sizes.append(count)
            return inner.words(count)

    m.perturb_codes(np.array([0.5]), Counting())
    assert sum(sizes) > 2_000  # a long value: it needed many refills' worth of words
    assert len(sizes) <= 2 + math.log2(sum(sizes))


def test_kernel_wrappers_validate_arrays():
    m = make("ogpm", 1.0)
    x = np.zeros(4)
    out = np.empty(4, np.uint32)
    args = m._kernel_args
    with pytest.raises(TypeError):
        _kernels.tpm_linear(x.astype(np.float32), np.zeros(4, np.uint64), out, args)
    with pytest.raises(TypeError):
        _kernels.tpm_linear(x, np.zeros(4, np.uint64), np.empty(4, np.int64), args)
    with pytest.raises(ValueError):
        _kernels.tpm_linear(x, np.zeros(3, np.uint64), out, args)
    with pytest.raises(ValueError):
        _kernels.tpm_linear(x, np.zeros(4, np.int64), out, args)


def test_kernels_never_use_numbas_internal_generator():
    """No code in the kernel module touches any ``random`` attribute or module."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(_kernels))
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    names |= {alias.name for node in ast.walk(tree)
              if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}
    assert not {n for n in names if "random" in n}
