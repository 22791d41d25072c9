"""A vector series of a mechanism of whole vectors (duchi-vector, sampled-duchi): each
axis' block is of the scalar distribution its codes follow (``AxisMarginal``), its mean
the unbiased average of the reported ±B with a Student/normal interval from the reports'
own variance; states round trip and impossible sums are refused."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from scipy import stats

from collector.aggregation.series import Series, new_series
from collector.aggregation.stats import StateError
from collector.storage.states import SeriesState
from edge_agent import protocol
from edge_agent.mechanisms.multidimensional import DuchiVector, SampledDuchi

FIELDS = ("x", "y", "z")
MECHANISMS = {
    "duchi-vector": DuchiVector(epsilon=2.0, dimensions=3, delta=1e-6, low=-4.0, high=4.0),
    "sampled-duchi": SampledDuchi(epsilon=3.0, dimensions=3, k=2, low=-4.0, high=4.0),
}
TRUTH = np.array([-2.5, 0.5, 3.0])


def _series(mechanism) -> Series:
    return new_series(kind="vector", channel="acc", description=protocol.describe(mechanism),
                      fields=FIELDS, window_seconds=10.0, keep_windows=5,
                      strategy=protocol.Strategy(k=getattr(mechanism, "k", 3), d=3,
                                                 epsilon=mechanism.epsilon))


def _fill(series: Series, mechanism, rng, messages=20, n=500):
    values = []
    for i in range(messages):
        x = np.clip(TRUTH + rng.normal(0, 1.0, (n, 3)), -4.0, 4.0)
        values.append(x)
        codes = [part.astype(np.int64) for part in mechanism.perturb_codes(x, rng)]
        series.update(agent=f"a{i % 4}", t=7.0 * i, codes=codes)
    return np.concatenate(values)


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_each_axis_mean_is_unbiased_with_the_reports_own_interval(name):
    """Over 60 seeds: every axis' z-score of the raw average against the readings' mean is
    standard normal (Kolmogorov-Smirnov, false alarm 1e-6), and no reported estimate (the
    raw average, or the reconstruction where its estimated error is smaller, its distance
    from the raw average in its bias bound) misses by more than a 1e-6 false alarm would
    allow (5.3 standard errors, 180 intervals)."""
    mechanism = MECHANISMS[name]
    marginal = mechanism.components[0]
    z = []
    for seed in range(60):
        rng = np.random.default_rng(seed)
        series = _series(mechanism)
        x = _fill(series, mechanism, rng, messages=4, n=500)
        view = series.get()
        for axis, field in enumerate(FIELDS):
            mean = view["axes"][field]["mean"]
            assert mean["method"] in ("raw", "reconstruction")
            assert (mean["bias_bound"] == 0.0) == (mean["method"] == "raw")
            truth = x[:, axis].mean()
            assert abs(mean["estimate"] - truth) < 5.3 * mean["stderr"] + mean["bias_bound"]
            z.append((mean["raw"] - truth) / mean["stderr"])
            n = view["axes"][field]["count"]
            # the reports' variance estimates the closed form's at the readings
            closed = float(np.mean(marginal.variance(x[:, axis])))
            assert mean["stderr"] ** 2 * n == pytest.approx(closed, rel=0.2)
    assert stats.kstest(z, "norm").pvalue > 1e-6


@pytest.mark.parametrize("name", list(MECHANISMS))
def test_counts_windows_and_states_round_trip(name):
    mechanism = MECHANISMS[name]
    rng = np.random.default_rng(1)
    series = _series(mechanism)
    x = _fill(series, mechanism, rng, messages=12, n=100)
    view = series.get(windows=True)
    per_reading = getattr(mechanism, "k", 3)
    assert view["count"] == per_reading * x.shape[0]
    assert sum(view["axes"][f]["count"] for f in FIELDS) == view["count"]
    assert len(view["windows"]) == 5
    assert view["strategy"] == {"k": per_reading, "d": 3, "epsilon": mechanism.epsilon}
    assert view["mechanism"] == mechanism.describe()
    document = msgspec.json.encode(series.to_state())
    state = msgspec.json.decode(document, type=SeriesState)
    again = Series.from_state(state, bins=50, window_seconds=10.0, keep_windows=5)
    assert again == series and again.get(windows=True) == view
    for f in FIELDS:
        histogram = view["axes"][f]["histogram"]
        assert len(histogram["edges"]) == 51 and len(histogram["estimate"]) == 50
    # Sums of codes no sign codes could give (a code is 0 or 1): refused.
    plain = msgspec.to_builtins(series.to_state())
    moments = plain["total"]["x"]["moments"]
    moments[1], moments[2] = moments[0] + 1, (moments[0] + 1) ** 2  # a code of 2 or more
    with pytest.raises(StateError, match=r"total\.x\.moments: sums beyond"):
        Series.from_state(plain, bins=50, window_seconds=10.0, keep_windows=5)
    # A state whose strategy is not the mechanism's own: refused like such a report.
    plain = msgspec.to_builtins(series.to_state())
    plain["strategy"]["k"] = 1 if per_reading != 1 else 2
    with pytest.raises(StateError, match="strategy"):
        Series.from_state(plain, bins=50, window_seconds=10.0, keep_windows=5)
