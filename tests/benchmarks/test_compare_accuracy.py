"""The paired accuracy comparison (``benchmarks.compare_accuracy --paired``): its ratio is
exact where one run's errors are a multiple of the other's, and its Monte Carlo error is
calibrated: a ratio's interval holds the true ratio as often as it says."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from benchmarks.compare_accuracy import main, paired_ratio


def test_a_multiple_of_the_same_errors_is_that_ratio_exactly():
    old = np.random.default_rng(1).normal(0, 2.0, 200)
    ratio, log_se = paired_ratio(list(old), list(1.07 * old))
    assert ratio == pytest.approx(1.07, rel=1e-12) and log_se == pytest.approx(0, abs=1e-12)


def test_the_ratio_s_error_is_calibrated_over_many_cells():
    # New = old + independent noise of a fifth of its size: the true RMSE ratio is
    # sqrt(1 + 0.2^2).  Over 2,000 simulated cells of 200 repetitions the +-3 error
    # interval misses it in 0.27% (binomial: 5.4 expected, more than 25 at a rate below
    # 1e-6), and the errors' own spread matches the stated one within 10%.
    rng = np.random.default_rng(7)
    truth, misses, logs, stated = math.sqrt(1.04), 0, [], []
    for _ in range(2000):
        old = rng.normal(0, 1.0, 200)
        new = old + rng.normal(0, 0.2, 200)
        ratio, log_se = paired_ratio(list(old), list(new))
        misses += abs(math.log(ratio / truth)) > 3 * log_se
        logs.append(math.log(ratio))
        stated.append(log_se)
    assert misses <= 25
    assert np.std(logs) == pytest.approx(np.mean(stated), rel=0.1)


def test_paired_run_flags_only_a_cell_worse_beyond_its_error(tmp_path, capsys):
    rng = np.random.default_rng(3)
    old_errors = rng.normal(0, 1.0, 200)
    cells_old = {"a|OGPM|1|500": [[e, True] for e in old_errors],
                 "a|SW-C|1|500": [[e, True] for e in old_errors]}
    cells_new = {"a|OGPM|1|500": [[1.04 * e, True] for e in old_errors],  # within 5%
                 "a|SW-C|1|500": [[1.2 * e, True] for e in old_errors]}  # 20% worse
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    old.write_text(json.dumps(cells_old))
    new.write_text(json.dumps(cells_new))
    assert main(["--paired", str(old), str(new)]) == 1
    out = capsys.readouterr().out
    assert "by more than 3 Monte Carlo errors: 1" in out
    cells_new["a|SW-C|1|500"] = cells_new["a|OGPM|1|500"]
    new.write_text(json.dumps(cells_new))
    assert main(["--paired", str(old), str(new)]) == 0
