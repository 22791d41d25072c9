"""Every window's estimate is a function of its sums alone: the same sums give the same
estimate, to the last bit, whatever order the reports came in, whatever else the series
holds and whatever it estimated before.  (Nothing is carried from one fit to another: no
start, no cached choice; the bootstrap's and the cross-validation's randomness is seeded
from the counts.)"""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from collector.aggregation.series import new_series
from edge_agent.mechanisms import ClassicalOGPM, TruncatedLaplace
from edge_agent.protocol import describe

WINDOW = 60.0


def _reports(mechanism, centre: float, seed: int) -> list[list[int]]:
    """Ten reports of 40 values around ``centre`` (clipped to the domain)."""
    rng = np.random.default_rng(seed)
    values = np.clip(rng.normal(centre, 0.3, 400), mechanism.low, mechanism.high)
    return np.array_split(mechanism.perturb_codes(values, rng), 10)


@pytest.mark.parametrize("mechanism", [ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0),
                                       TruncatedLaplace(epsilon=1.0, low=-2.0, high=2.0)],
                         ids=lambda m: m.name)
@pytest.mark.parametrize("centre", [-1.8, 0.1, 1.6], ids=["low end", "middle", "high end"])
def test_a_windows_estimate_depends_on_its_sums_alone(mechanism, centre):
    windows = {w: _reports(mechanism, centre + 0.05 * w, seed=w) for w in range(6)}
    watched = 3

    def estimated(order, windows_fed, compute_order):
        series = new_series(kind="linear", channel="x", description=describe(mechanism))
        for w in windows_fed:
            reports = windows[w] if w != watched else [windows[w][i] for i in order]
            for i, codes in enumerate(reports):
                series.update(agent=f"a{i}", t=WINDOW * w + 1 + i, codes=codes)
        for w in compute_order:
            series.compute(w)
        return msgspec.json.encode(series.estimate(series.windows[watched], WINDOW, watched))

    in_order = estimated(range(10), range(6), [5, 4, 3, 2, 1, 0])
    # The window's reports reversed, alone in the series, estimated first.
    alone = estimated(range(9, -1, -1), [watched], [watched])
    # Shuffled, after every other window, estimated oldest first and twice.
    shuffled = estimated(np.random.default_rng(1).permutation(10), [5, 0, 4, 1, 3, 2],
                         [0, 1, 2, 3, 4, 5, 3])
    assert in_order == alone == shuffled
    count, point = msgspec.json.decode(in_order)
    assert count == 400 and point["mean"]["estimate"] is not None, point
