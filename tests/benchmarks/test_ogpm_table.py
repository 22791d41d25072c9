"""benchmarks/ogpm_table.py at a tiny size: every row of its tables, and the errors it
measures through the collector's estimator agree with the closed forms it prints beside them
(fixed seeds; bounds with false-alarm rates of about 1e-6)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from benchmarks import ogpm_table
from edge_agent.mechanisms import ClassicalOGPM, PiecewiseMechanism
from edge_agent.mechanisms.registry import LINEAR

EPSILONS = (1.0, 4.0)
REPETITIONS = 30
# Off the middle (mean 2/7), as the paper's data and ours: the plain averages are biased, so
# the collector's other candidates are exercised too.
VALUES = np.random.default_rng(7).beta(2.0, 5.0, 300)
ALPHA = 1e-6


@pytest.fixture(scope="module")
def cells():
    return ogpm_table.measure(VALUES, epsilons=EPSILONS, repetitions=REPETITIONS, jobs=1)


def test_every_mechanism_and_epsilon_has_a_row(cells):
    labels = tuple(ogpm_table.LABELS)
    # every pure epsilon-LDP configuration name (not the (ε, δ) Opt-GM), each its own label
    assert sorted(ogpm_table.LABELS.values()) == sorted(
        name for name, choice in LINEAR.items() if not choice.delta)
    assert len(set(labels)) == len(labels) and "OGPM" in labels and "PM-C" in labels
    assert set(cells) == {(e, label) for e in EPSILONS for label in labels}
    assert all(cell["runs"] == REPETITIONS for cell in cells.values())
    text = ogpm_table.report(cells, VALUES, epsilons=EPSILONS, labels=labels,
                             repetitions=REPETITIONS, header="header")
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for label in labels:
        # once in each of the two summaries, once per ε in the detail table
        assert sum(row.startswith(f"| {label} |") for row in rows) == 2, label
        for e in EPSILONS:
            assert sum(row.startswith(f"| {e:g} | {label} |") for row in rows) == 1
    for e in EPSILONS:  # the paper table: one row per ε
        assert sum(row.startswith(f"| {e:g} | 0") for row in rows) == 1
    assert "nan" not in text


def _bounds(bias: float, variance: float, runs: int) -> tuple[float, float]:
    """Where the runs' mean squared error lies with probability 1 - ALPHA if the errors are
    normal with this bias and variance: sum e² / variance is noncentral chi-square."""
    centrality = runs * bias * bias / variance
    law = stats.ncx2(runs, centrality) if centrality > 0 else stats.chi2(runs)
    return (law.ppf(ALPHA / 2) * variance / runs, law.ppf(1 - ALPHA / 2) * variance / runs)


def test_measured_errors_agree_with_the_closed_forms(cells):
    z_bound = stats.norm.isf(ALPHA / 2)
    checked = 0
    for (epsilon, label), cell in cells.items():
        bias, variance = cell["forms"]["raw"]
        # the plain average: its mean error and its mean squared error
        assert abs(cell["bias_raw"] - bias) <= z_bound * math.sqrt(variance / REPETITIONS), \
            (epsilon, label)
        low, high = _bounds(bias, variance, REPETITIONS)
        assert low <= cell["rmse_raw"] ** 2 <= high, (epsilon, label)
        assert abs(cell["z"]["raw"][0]) <= z_bound
        checked += 1
        if "inversion" in cell["z"]:  # the collector's inversion is the affine one
            low, high = _bounds(*cell["forms"]["inversion"], REPETITIONS)
            assert low <= cell["rmse_inversion"] ** 2 <= high, (epsilon, label)
            checked += 1
    assert checked >= len(cells) + 2 * len(EPSILONS)  # PM-C, SW-C (and SW) at least


def test_unbiased_mechanisms_are_measured_against_their_plain_average(cells):
    """An unbiased mechanism's plain average is the reference (its closed-form bias 0);
    the collector reports it or the reconstruction, whichever it estimates errs less."""
    for (_, label), cell in cells.items():
        mechanism = ogpm_table.mechanism_for(label, 1.0)
        if mechanism.unbiased:
            assert set(cell["methods"]) <= {"raw", "reconstruction"}
            assert sum(cell["methods"].values()) == REPETITIONS
            assert ogpm_table.reference(cell) == "raw"
            assert cell["forms"]["raw"][0] == pytest.approx(0.0, abs=1e-12)
            # on this table's data it errs less (PM, Duchi, PTT, II-PTT: 1-6% less)
            assert cell["mae"] <= cell["mae_raw"]


def test_closed_forms_of_a_known_case():
    # PM-C on [0, 1]: E[M(x)] = 1/2 + (x - 1/2) / C with C = (s + 1) / (s - 1), s = e^(ε/2)
    # (the compressed PM of the paper's Sec. 7), so the plain average's bias is
    # (1/2 - mean)(1 - 1/C) and the inversion's 0.
    epsilon = 2.0
    s = math.exp(epsilon / 2)
    mechanism = PiecewiseMechanism(epsilon=epsilon, low=0.0, high=1.0, compressed=True)
    forms = ogpm_table.closed_forms(mechanism, VALUES)
    expected = (0.5 - VALUES.mean()) * (1 - (s - 1) / (s + 1))
    assert forms["raw"][0] == pytest.approx(expected, rel=1e-9)
    assert forms["inversion"][0] == pytest.approx(0.0, abs=1e-12)
    assert forms["raw"][1] == pytest.approx(mechanism.variance(VALUES).mean() / VALUES.size)
    # OGPM against PM-C for data where both means are affine: (s + 1) / (2 s)
    assert ogpm_table.shrink("OGPM", epsilon) / ogpm_table.shrink("PM-C", epsilon) == \
        pytest.approx((s + 1) / (2 * s), rel=1e-9)
    # the folded normal: E|N(0, 1)| = sqrt(2 / pi); far from 0 it is the bias
    assert ogpm_table.expected_absolute(0.0, 1.0) == pytest.approx(math.sqrt(2 / math.pi))
    assert ogpm_table.expected_absolute(-10.0, 1.0) == pytest.approx(10.0, rel=1e-12)
    assert isinstance(ogpm_table.mechanism_for("OGPM", epsilon), ClassicalOGPM)
