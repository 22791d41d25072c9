"""Estimation quality: bias removal and EMS beat the raw statistics, and intervals cover."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collector.aggregation.series import new_series
from collector.estimation import ems
from edge_agent import protocol
from edge_agent.mechanisms import (
    BoundedLaplace,
    CircularOGPM,
    ClassicalOGPM,
    PiecewiseMechanism,
    PolarOGPM,
    SquareWave,
    TruncatedLaplace,
)

N = 20_000
EPSILONS = [0.5, 1.0, 2.0, 4.0]


def near_edge(rng, n):
    """Most of the data close to the lower end of [-2, 2] (Beta(1.3, 9))."""
    return -2.0 + 4.0 * rng.beta(1.3, 9.0, n)


def bimodal(rng, n):
    """Two modes, 70/30, so that the mean is far from the middle where raw means are pulled."""
    first = int(0.7 * n)
    return np.clip(np.concatenate([rng.normal(-1.3, 0.25, first),
                                   rng.normal(0.9, 0.3, n - first)]), -2.0, 2.0)


def assert_close(mean, truth):
    """The interval's own terms with a 1e-6 false-alarm rate (5 standard errors)."""
    assert abs(mean["estimate"] - truth) <= 5 * mean["stderr"] + mean["bias_bound"]


def summarise(mechanism, x, rng):
    series = new_series(channel="c", kind="linear", description=protocol.describe(mechanism),
                        bins=50)
    codes = mechanism.perturb_codes(x, rng)
    for part in np.array_split(codes, 20):
        series.update(agent="a", t=0.0, codes=part)
    return series.get()


def true_histogram(x, edges):
    counts, _ = np.histogram(x, bins=edges)
    return counts / counts.sum()


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("data", [near_edge, bimodal])
def test_ogpm_estimates_beat_the_raw_statistics(epsilon, data):
    rng = np.random.default_rng([int(epsilon * 10), data is bimodal])
    x = data(rng, N)
    view = summarise(ClassicalOGPM(epsilon=epsilon, low=-2, high=2), x, rng)
    mean, histogram = view["mean"], view["histogram"]
    truth = x.mean()
    assert abs(mean["estimate"] - truth) < abs(mean["raw"] - truth)
    assert_close(mean, truth)
    edges = np.array(histogram["edges"])
    target = true_histogram(x, edges)
    raw_distance = np.abs(np.array(histogram["raw"]) - target).sum()
    ems_distance = np.abs(np.array(histogram["estimate"]) - target).sum()
    assert ems_distance < raw_distance
    # Measurably closer.  Two modes 2.2 apart on [-2, 2] cannot be resolved
    # much better than the raw reports at eps <= 1 with 20,000 reports (EMS
    # gains 5-15% there, the same gap on every seed); elsewhere it gains 2-7x.
    margin = 0.97 if (data is bimodal and epsilon <= 1.0) else 0.8
    assert ems_distance < margin * raw_distance


@pytest.mark.parametrize("mechanism", [
    PiecewiseMechanism(epsilon=1.0, low=-2, high=2, compressed=True),
    SquareWave(epsilon=1.0, low=-2, high=2),
    SquareWave(epsilon=2.0, low=-2, high=2, compressed=True),
    TruncatedLaplace(epsilon=2.0, low=-2, high=2),
    BoundedLaplace(epsilon=2.0, low=-2, high=2),
], ids=lambda m: f"{m.name}{'-c' if getattr(m, 'compressed', False) else ''}")
@pytest.mark.parametrize("data", [near_edge, bimodal])
def test_biased_baselines_are_corrected_too(mechanism, data):
    rng = np.random.default_rng(11)
    x = data(rng, N)
    mean = summarise(mechanism, x, rng)["mean"]
    assert abs(mean["estimate"] - x.mean()) < abs(mean["raw"] - x.mean())
    assert_close(mean, x.mean())


def test_interval_coverage_is_honest_over_many_runs():
    """About 95% of intervals cover; the bias bound makes near-edge OGPM conservative."""
    covered, total = 0, 0
    for seed in range(40):
        rng = np.random.default_rng(1000 + seed)
        x = np.clip(rng.normal(rng.uniform(-1.5, 1.5), 0.4, 5000), -2, 2)
        for mechanism in (ClassicalOGPM(epsilon=2.0, low=-2, high=2),
                          PiecewiseMechanism(epsilon=2.0, low=-2, high=2, compressed=True)):
            low, high = summarise(mechanism, x, rng)["mean"]["ci95"]
            covered += low <= x.mean() <= high
            total += 1
    # Binomial(80, 0.95): fewer than 68 covered has probability below 1e-4.
    assert covered >= 68, f"{covered}/{total}"


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_circular_mean_within_expected_error(epsilon):
    rng = np.random.default_rng(int(epsilon * 100))
    mechanism = CircularOGPM(epsilon=epsilon, origin=-math.pi)
    theta = rng.vonmises(2.5, 2.0, N)
    series = new_series(channel="r", kind="circular", description=protocol.describe(mechanism))
    series.update(agent="a", t=0.0, codes=mechanism.perturb_codes(theta, rng))
    view = series.get()
    true_direction = np.angle(np.exp(1j * theta).mean())
    true_length = np.abs(np.exp(1j * theta).mean())
    rho = mechanism.mean_resultant_length()
    # The reports' resultant is rho * R: its direction has standard error about
    # 1 / (rho R sqrt(2N)); allow 6 of those.
    error = abs(np.angle(np.exp(1j * (view["circular_mean"] - true_direction))))
    assert error < 6 / (rho * true_length * math.sqrt(2 * N))
    assert view["resultant_length"]["estimate"] == pytest.approx(true_length,
                                                                 abs=6 / (rho * math.sqrt(N)))
    assert view["resultant_length"]["raw"] < view["resultant_length"]["estimate"]
    # The reconstruction is closer to the true angle histogram than the raw one.
    edges = np.array(view["histogram"]["edges"])
    target = true_histogram((theta + math.pi) % (2 * math.pi) - math.pi, edges)
    assert (np.abs(np.array(view["histogram"]["estimate"]) - target).sum()
            < np.abs(np.array(view["histogram"]["raw"]) - target).sum())


def test_polar_mean_vector_and_components():
    rng = np.random.default_rng(5)
    mechanism = PolarOGPM(epsilon=6.0, radius_max=2.0)
    r = np.clip(rng.gamma(6.0, 0.12, N), 0, 2)
    a = rng.vonmises(1.0, 3.0, N) % (2 * math.pi)
    series = new_series(channel="p", kind="polar", description=protocol.describe(mechanism))
    series.update(agent="a", t=0.0, codes=mechanism.perturb_codes(r, a, rng))
    view = series.get()
    truth = (r * np.exp(1j * a)).mean()
    vector = view["mean_vector"]
    assert vector["x"] == pytest.approx(truth.real, abs=0.05)
    assert vector["y"] == pytest.approx(truth.imag, abs=0.05)
    assert_close(view["radius"]["mean"], r.mean())


def test_ems_recovers_a_known_distribution_and_quantiles():
    mechanism = ClassicalOGPM(epsilon=3.0, low=0.0, high=1.0)
    edges = np.linspace(0, 1, 21)
    matrix = ems.transition_matrix(mechanism, edges, edges)
    assert np.allclose(matrix.sum(axis=0), 1.0)
    truth = np.zeros(20)
    truth[4:8] = 0.25
    counts = 1e6 * (matrix @ truth)  # noiseless expected report counts
    p = ems.reconstruct(counts, matrix)  # EMS
    reports = counts / counts.sum()
    # Smoothing blurs the box's edges, but the mass lands where it belongs and
    # far more of it than in the raw reports.
    assert p[4:8].sum() > reports[4:8].sum() + 0.08
    assert np.abs(p - truth).sum() < 0.8 * np.abs(reports - truth).sum()
    q = ems.quantiles(edges, truth, [0.5])
    assert q["0.5"] == pytest.approx(0.3)
