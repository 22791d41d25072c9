"""benchmarks/bench_timing.py at a tiny size: every mechanism and value set has its row, and
the words it counts one value at a time are the words the batch kernels read (no timing is
asserted)."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import bench_timing
from edge_agent.mechanisms import _categorical, _kernels
from edge_agent.mechanisms.randomness import SeededRandom
from edge_agent.mechanisms.tent import _tent_linear

N = 200


@pytest.fixture(scope="module")
def result():
    return bench_timing.run(batch=64, rounds=2, singles=20, draws=800)


def test_every_mechanism_and_value_set_has_a_row(result):
    text = bench_timing.markdown(result)
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    labels = [s.label for s in bench_timing.subjects()]
    assert len(set(labels)) == len(labels)
    for label in labels:
        for kind in bench_timing.SETS:
            assert sum(row.startswith(f"| {label} | {kind} |") for row in rows) == 1
    assert "nan" not in text
    for label in ("OGPM", "PM-C", "Duchi"):  # one word per value, whatever the value
        assert all(np.all(result["words"][(label, kind)]["words"] == 1)
                   for kind in bench_timing.SETS)


def _subject(kind):
    return next(s for s in bench_timing.subjects() if isinstance(s.mechanism, kind))


def _words(seed, count):
    return SeededRandom(np.random.default_rng(seed)).words(count)


def test_words_counted_one_at_a_time_are_the_batch_kernels():
    rng = np.random.default_rng(1)
    seed = 5
    g = _subject(bench_timing.OptimalGaussian).mechanism
    x = rng.uniform(g.low, g.high, N)
    counted = bench_timing.words_read(g, x, seed)["words"]
    words = _words(seed, 64 * N + 4096)
    out = np.empty(N, dtype=np.uint32)
    done, read = _kernels._gaussian_cells(
        x, words, out, 0, float(g.low), 1.0 / float(g.step), int(g.steps), int(g.tail_cells),
        int(2 * g.tail_cells + g.steps), int(g.t), int(g.m))
    assert done == N and read == counted.sum()

    p = _subject(bench_timing.TypeIIPTT).mechanism
    counted = bench_timing.words_read(p, x, seed)
    done, read, _, _ = _tent_linear(x, _words(seed, 64 * N + 4096), out, 0, 0, 1,
                                    *p._kernel_args)
    assert done == N and read == counted["words"].sum()
    assert np.array_equal(counted["tent"], counted["words"] == 2)  # no rejection in 200

    v = _subject(bench_timing.DuchiVector).mechanism
    tuples = rng.uniform(v.low, v.high, (N, v.dimensions))
    counted = bench_timing.words_read(v, tuples, seed)["words"]
    signs = np.zeros(N, dtype=np.uint64)
    xn, _ = v._normalized(tuples)
    done, read = _categorical.sign_vectors(xn, _words(seed, 64 * N * v.dimensions + 4096),
                                           np.uint64(v.alpha_weight), signs, 0)
    assert done == N and read == counted.sum()
    ends = bench_timing.words_read(v, np.full((N, v.dimensions), v.high), seed)
    # A report agrees with V on more than half the axes: it reads a word for each of V's
    # d, one for the half-space and at least one pattern.
    assert ends["plus"].any() and (~ends["plus"]).any()
    assert np.all(ends["words"] >= v.dimensions + 2)
