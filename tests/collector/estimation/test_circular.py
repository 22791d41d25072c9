"""Circular summaries (collector.estimation.circular): the mean direction's and the mean resultant
length's 95% intervals cover the truth, the length is bias-corrected and not clipped, the
doubled-angle sums merge exactly, states without them still load, and the dashboard shows
the intervals."""

from __future__ import annotations

import json
import math
import time

import msgspec
import numpy as np
import pytest
from scipy import special, stats

from collector.aggregation.blocks import CircularBlock
from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import Series, new_series
from collector.aggregation.stats import StateError, TrigMoments
from collector.api.documents import Views
from collector.estimation import circular
from collector.estimation.jsonsafe import json_safe
from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, PolarOGPM
from tests.support.ports import HANG_GUARD_MS
from tests.support.web import Dashboard, assert_shows, card, request, serve, strict_json

REPETITIONS = 400
# Fewer covered than this in REPETITIONS has probability below 1e-6 at 95% coverage.
COVERED_AT_LEAST = int(stats.binom.ppf(1e-6, REPETITIONS, 0.95))
TRUE_DIRECTION = 3.0  # near the origin -pi of the channels below: intervals wrap
CONCENTRATED = 400.0  # von Mises concentration: a roll channel at one angle, R = 0.99875
SPREAD = 0.02  # near-uniform angles, R = 0.01


def resultant(kappa: float) -> float:
    """The mean resultant length of a von Mises distribution, I1(κ)/I0(κ)."""
    return float(special.i1e(kappa) / special.i0e(kappa))


def angle_error(a: float, b: float) -> float:
    return abs(math.remainder(a - b, 2 * math.pi))


def summaries(mechanism, kappa: float, n: int, seed: int, *, bound: bool = False):
    """The circular summary of REPETITIONS independent channels of ``n`` readings each
    (von Mises around TRUE_DIRECTION), through the real statistic and the real math."""
    rng = np.random.default_rng(seed)
    origin, step = mechanism.grid_values
    rho = mechanism.mean_resultant_length()
    rho2 = circular.noise_second_moment(mechanism)
    chunk = max(1, 800_000 // n)  # repetitions perturbed at once (memory)
    out = []
    for start in range(0, REPETITIONS, chunk):
        reps = min(chunk, REPETITIONS - start)
        angles = rng.vonmises(TRUE_DIRECTION, kappa, (reps, n))
        codes = mechanism.perturb_codes(angles.ravel(), rng).reshape(reps, n)
        # The statistic's sums, for all repetitions at once (checked on the first).
        trig = TrigMoments(origin, step, mechanism.period)
        theta = trig.radians(codes)
        c, s = np.cos(theta), np.sin(theta)
        sums = np.stack([c.sum(1), s.sum(1), (c * c - s * s).sum(1), 2 * (c * s).sum(1)], 1)
        trig.update(codes[0])
        assert sums[0] == pytest.approx([trig.x, trig.y, trig.x2, trig.y2], abs=1e-8)
        for x, y, x2, y2 in sums.tolist():
            out.append(circular.summary(n, x, y, None if bound else x2,
                                        None if bound else y2, rho=rho, rho2=rho2,
                                        period=mechanism.period, origin=mechanism.origin))
    return out


def coverage(results, kappa: float) -> tuple[int, int, int]:
    """(direction intervals covering the truth, counting "any direction" as covering;
    length intervals covering it; "any direction" answers)."""
    truth = resultant(kappa)
    direction = length = anywhere = 0
    for result in results:
        half = result["direction"]["half_width"]
        if half is None:
            anywhere += 1
            direction += 1
        else:
            direction += angle_error(result["circular_mean"], TRUE_DIRECTION) <= half
        low, high = result["resultant_length"]["ci95"]
        length += low <= truth <= high
    return direction, length, anywhere


# Measured coverage (direction, length) of 400 repetitions with these seeds, for the
# report: every case is at 95% within binomial error.
@pytest.mark.parametrize("epsilon", [0.5, 2.0, 6.0])
@pytest.mark.parametrize("n", [50, 20_000])
@pytest.mark.parametrize("kappa", [CONCENTRATED, SPREAD], ids=["concentrated", "spread"])
def test_intervals_cover_the_truth(epsilon, n, kappa):
    mechanism = CircularOGPM(epsilon=epsilon, origin=-math.pi)
    results = summaries(mechanism, kappa, n, seed=[int(10 * epsilon), n, int(kappa)])
    direction, length, anywhere = coverage(results, kappa)
    print(f"eps={epsilon} n={n} kappa={kappa}: direction {direction}/{REPETITIONS}, "
          f"length {length}/{REPETITIONS}, any direction {anywhere}")
    assert direction >= COVERED_AT_LEAST, (direction, anywhere)
    assert length >= COVERED_AT_LEAST, length
    halves = [r["direction"]["half_width"] for r in results]
    if kappa == SPREAD:
        # Near-uniform angles: no direction, or a wide one.
        assert np.median([math.pi if h is None else h for h in halves]) > 0.5
    elif n == 20_000:
        # Concentrated, many reports: always a direction, narrow.
        assert None not in halves and max(halves) < 0.1
        assert all(r["covariance"] == "sample" for r in results)


def test_a_state_without_the_doubled_sums_gives_wider_intervals_that_still_cover():
    mechanism = CircularOGPM(epsilon=2.0, origin=-math.pi)
    for kappa in (CONCENTRATED, 2.0):
        bounded = summaries(mechanism, kappa, 2000, seed=7, bound=True)
        exact = summaries(mechanism, kappa, 2000, seed=7)
        direction, length, _ = coverage(bounded, kappa)
        assert direction >= COVERED_AT_LEAST and length >= COVERED_AT_LEAST
        assert all(b["covariance"] == "bound" for b in bounded)
        for b, e in zip(bounded, exact):
            assert b["circular_mean"] == e["circular_mean"]
            assert b["resultant_length"]["estimate"] == e["resultant_length"]["estimate"]
            assert b["direction"]["half_width"] >= e["direction"]["half_width"]
            assert b["resultant_length"]["stderr"] >= e["resultant_length"]["stderr"]


# -- a channel at one angle (what used to show resultant length 1, circular std 0) -------

def series(mechanism, readings, rng, *, kind="circular", parts: int = 1) -> Series:
    s = new_series(channel="roll", kind=kind, description=protocol.describe(mechanism), bins=36)
    for part in np.array_split(mechanism.perturb_codes(readings, rng), parts):
        s.update(agent="a", t=0.0, codes=part)
    return s


def test_a_roll_channel_at_one_angle_is_not_clipped_and_has_no_fake_zero_std():
    mechanism = CircularOGPM(epsilon=6.0, origin=-math.pi)
    rng = np.random.default_rng(11)
    readings = np.full(20_000, TRUE_DIRECTION)  # R = 1 exactly
    view = series(mechanism, readings, rng).get()
    length = view["resultant_length"]
    assert length["estimate"] > 1  # noise on this seed: said as it is
    assert length["raw"] < 1  # the reports' own resultant; divided by rho it exceeds 1
    low, high = length["ci95"]
    assert low < 1 == high and length["estimate"] - low == pytest.approx(
        circular.Z95 * length["stderr"], rel=0.05)
    assert view["circular_std"] is None
    assert view["circular_std_reason"] == circular.STD_ABOVE_ONE
    direction = view["direction"]
    assert direction["reason"] is None and direction["half_width"] < 0.01
    assert angle_error(view["circular_mean"], TRUE_DIRECTION) <= direction["half_width"]


def test_a_spread_channel_has_any_direction_and_a_length_interval_from_zero():
    mechanism = CircularOGPM(epsilon=0.5, origin=-math.pi)
    rng = np.random.default_rng(12)
    view = series(mechanism, rng.uniform(-math.pi, math.pi, 5000), rng).get()
    direction = view["direction"]
    assert direction["half_width"] is None and direction["ci95"] is None
    assert direction["reason"] == circular.NOT_FROM_ZERO
    assert view["circular_mean"] is not None  # still the reports' mean direction
    assert view["resultant_length"]["ci95"][0] == 0.0
    assert view["circular_std"] is None and view["circular_std_reason"] == circular.STD_ZERO \
        or view["circular_std"] > 1.5


def test_bias_correction_of_the_squared_length():
    """(nR̄² − 1)/(n − 1) is unbiased for |E u|² where R̄² is not (uniform angles: 0)."""
    rng = np.random.default_rng(13)
    n = 20
    angles = rng.uniform(-math.pi, math.pi, (20_000, n))
    squared = np.abs(np.exp(1j * angles).mean(axis=1)) ** 2
    assert squared.mean() == pytest.approx(1 / n, rel=0.03)  # biased up by (1 - R²)/n
    assert ((n * squared - 1) / (n - 1)).mean() == pytest.approx(0.0, abs=1e-3)


# -- the math on its own -----------------------------------------------------------------

def test_the_direction_interval_wraps_through_the_origin():
    n, theta, spread = 10_000, math.pi - 0.01, 0.05
    result = circular.summary(n, n * spread * math.cos(theta), n * spread * math.sin(theta),
                              0.0, 0.0, rho=0.5, rho2=0.1, origin=-math.pi)
    low, high = result["direction"]["ci95"]
    half = result["direction"]["half_width"]
    assert 0.01 < half < 0.5
    assert low == pytest.approx(theta - half) and high == pytest.approx(theta + half - 2 * math.pi)
    assert low > high  # counter-clockwise from low, through the origin, to high
    # The same in degrees on [0, 360): a mean just above 0.
    degrees = circular.summary(n, n * spread, n * spread * 0.01, 0.0, 0.0, rho=0.5, rho2=0.1,
                               period=360.0, origin=0.0)
    low, high = degrees["direction"]["ci95"]
    assert degrees["circular_mean"] == pytest.approx(math.degrees(0.01), rel=1e-3)
    assert low > 300 and high < 60 and degrees["direction"]["half_width"] == pytest.approx(
        math.degrees(half), rel=1e-3)


def test_small_and_degenerate_inputs():
    empty = circular.summary(0, 0.0, 0.0, 0.0, 0.0, rho=0.5, rho2=0.1)
    assert empty["circular_mean"] is None and empty["direction"]["reason"] == circular.NO_REPORTS
    one = circular.summary(1, 1.0, 0.0, 1.0, 0.0, rho=0.5, rho2=0.1)
    assert one["circular_mean"] == 0.0 and one["resultant_length"]["raw"] == 1.0
    assert one["resultant_length"]["estimate"] is None
    assert one["direction"]["reason"] == circular.TOO_FEW
    # Every report the same code: no sampled spread, the mechanism's floor instead.
    same = circular.summary(50, 50.0, 0.0, 50.0, 0.0, rho=0.9, rho2=0.8)
    assert same["direction"]["half_width"] > 0
    assert same["resultant_length"]["estimate"] > 1
    assert same["resultant_length"]["ci95"] == [1.0, 1.0]  # all of it above 1: the edge
    # Half the reports at 0 and half at pi: a resultant of 0, no direction, no std.
    opposite = circular.summary(50, 0.0, 0.0, 50.0, 0.0, rho=0.9, rho2=0.8)
    assert opposite["direction"]["reason"] == circular.NOT_FROM_ZERO
    assert opposite["resultant_length"]["estimate"] == 0.0
    assert opposite["circular_std_reason"] == circular.STD_ZERO
    # A mechanism whose reports carry no direction.
    assert circular.summary(50, 20.0, 0.0, 0.0, 0.0, rho=0.0, rho2=0.0)["direction"][
        "reason"] == circular.NO_SHRINK


def test_the_length_interval_is_never_empty_and_grows_with_the_observed_length():
    previous = (0.0, 0.0)
    for t in np.concatenate([np.linspace(0.0, 6.0, 121), [10.0, 29.9, 30.1, 100.0]]):
        low, high = circular._rice_length(float(t))
        assert 0.0 <= low < high, t
        assert low >= previous[0] - 1e-9 and high >= previous[1] - 1e-9, t
        previous = (low, high)
    # Far from zero: the normal interval.
    low, high = circular._rice_length(200.0)
    assert high - low == pytest.approx(2 * circular.Z95)


@pytest.mark.parametrize("epsilon", [0.5, 1.0, 3.0, 6.0])
def test_the_noise_second_moment_is_the_closed_form(epsilon):
    """E cos 2(θ' − x) = ((s − 1/s)/(2π))·sin(2π/(s + 1)), s = e^(ε/2): the k = 2 term of
    the same integral as rho's (docs/guides/FIELD_NOTES.md, Circular OGPM)."""
    s = math.exp(epsilon / 2)
    closed = (s - 1 / s) / (2 * math.pi) * math.sin(2 * math.pi / (s + 1))
    mechanism = CircularOGPM(epsilon=epsilon, origin=-math.pi)
    assert circular.noise_second_moment(mechanism) == pytest.approx(closed, abs=1e-5)
    assert circular.noise_second_moment(CircularOGPM(epsilon=epsilon, period=360.0)) \
        == pytest.approx(closed, abs=1e-5)


# -- the doubled-angle sums: exact merging, states, old states ---------------------------

def test_incremental_batch_and_merged_doubled_sums_agree():
    mechanism = CircularOGPM(epsilon=2.0, origin=-math.pi)
    description = protocol.describe(mechanism)
    rng = np.random.default_rng(14)
    codes = mechanism.perturb_codes(rng.vonmises(1.0, 3.0, 6000), rng)
    batch = CircularBlock(description, 36)
    batch.update(codes)
    incremental = new_series(channel="roll", kind="circular", bins=36, description=description)
    for i, part in enumerate(np.array_split(codes, 13)):
        incremental.update(agent="a", t=float(i), codes=part)
    halves = [new_series(channel="roll", kind="circular", bins=36, description=description)
              for _ in range(2)]
    halves[0].update(agent="a", t=0.0, codes=codes[:2500])
    halves[1].update(agent="b", t=0.0, codes=codes[2500:])
    merged = halves[0].merge(halves[1])
    one = batch.trig
    c, s = np.cos(one.radians(codes)), np.sin(one.radians(codes))
    assert one.x2 == pytest.approx(float(np.sum(np.cos(2 * np.arctan2(s, c)))), abs=1e-8)
    assert one.y2 == pytest.approx(float(np.sum(np.sin(2 * np.arctan2(s, c)))), abs=1e-8)
    for other in (incremental.total["value"], merged.total["value"]):
        assert other.trig == one and other.trig.doubled_known  # sums equal up to rounding
        assert other.trig.x2 == pytest.approx(one.x2, rel=1e-12, abs=1e-9)
        assert other.trig.y2 == pytest.approx(one.y2, rel=1e-12, abs=1e-9)
        view, expected = other.get(), batch.get()
        assert view["direction"]["half_width"] == pytest.approx(
            expected["direction"]["half_width"], rel=1e-9)
        assert view["resultant_length"]["ci95"] == pytest.approx(
            expected["resultant_length"]["ci95"], rel=1e-9)


def as_json(state):
    return json.loads(protocol.encode(state))


def without_doubled_sums(state: dict) -> dict:
    """A series state as collectors wrote it before the doubled-angle sums: [n, x, y]."""
    state = json.loads(json.dumps(state))
    for blocks in [state["total"]] + [blocks for _, blocks in state["windows"]]:
        for block in blocks.values():
            if "trig" in block:
                assert len(block["trig"]) == 4
                del block["trig"][3]
    return state


@pytest.mark.parametrize("kind", ["circular", "polar"])
def test_an_old_state_without_the_doubled_sums_loads_and_bounds_the_covariance(kind):
    rng = np.random.default_rng(15)
    if kind == "circular":
        mechanism = CircularOGPM(epsilon=2.0, origin=-math.pi)
        codes = mechanism.perturb_codes(rng.vonmises(1.0, 3.0, 3000), rng)
    else:
        mechanism = PolarOGPM(epsilon=4.0, radius_max=2.0)
        radius, angle = mechanism.components
        codes = [radius.perturb_codes(rng.uniform(0, 2, 3000), rng),
                 angle.perturb_codes(rng.vonmises(1.0, 3.0, 3000), rng)]
    new = new_series(channel="c", kind=kind, description=protocol.describe(mechanism), bins=36)
    new.update(agent="a", t=0.0, codes=codes)
    old_state = without_doubled_sums(as_json(new.to_state()))
    old = Series.from_state(old_state, bins=36, window_seconds=60.0, keep_windows=60)
    block = "value" if kind == "circular" else "angle"
    view, fresh = old.total[block].get(), new.total[block].get()
    assert view["covariance"] == "bound" and fresh["covariance"] == "sample"
    assert view["circular_mean"] == fresh["circular_mean"]
    assert view["direction"]["half_width"] > fresh["direction"]["half_width"]
    # Saved again, it is the old form still; merged with new sums, the bound stays.
    assert as_json(old.to_state()) == old_state
    more = new_series(channel="c", kind=kind, description=protocol.describe(mechanism), bins=36)
    more.update(agent="b", t=1.0, codes=codes)
    old.merge(more)
    assert old.total[block].get()["covariance"] == "bound"
    assert not old.total[block].trig.doubled_known
    # Its snapshot is still a valid message.
    protocol.snapshot(json_safe({**old.get(), "other_series": []}), channel="c", t=0.0)


def test_the_state_keeps_the_doubled_sums_and_refuses_inconsistent_ones():
    mechanism = CircularOGPM(epsilon=1.0, origin=-math.pi)
    trig = TrigMoments(*mechanism.grid_values, mechanism.period)
    trig.update(mechanism.perturb_codes(np.full(500, 0.5), np.random.default_rng(16)))
    state = trig.to_state()
    assert len(state) == 4 and len(state[3]) == 2
    again = TrigMoments.from_state(trig.params(), json.loads(json.dumps(state)))
    assert again == trig and again.to_state() == state
    n, x, y, (x2, y2) = state
    for bad, match in [
        ([n, x, y, [2.0 * n, 0.0]], "doubled-angle resultant"),
        ([n, x, y, [-0.999 * n, 0.0]], "inconsistent"),  # concentrated angles, spread 2θ
        ([n, x, y, [x2]], "expected"),
        ([n, x, y, [x2, y2], 0.0], "expected"),
        ([n, x, y, [x2, float("nan")]], "expected"),
    ]:
        with pytest.raises(StateError, match=match):
            TrigMoments.from_state(trig.params(), bad)


def test_snapshots_of_older_collectors_still_decode():
    """A retained snapshot published before the intervals (no direction, no stderr)."""
    old = {"kind": "circular", "channel": "roll", "t": 1.0, "count": 10, "messages": 1,
           "agents": 1, "other_series": [],
           "mechanism": protocol.describe(CircularOGPM(epsilon=1.0)),
           "circular_mean": 0.1, "resultant_length": {"raw": 0.2, "estimate": 0.6},
           "circular_std": 1.0, "histogram": {"edges": [0.0, 1.0], "raw": [1.0],
                                              "estimate": None}}
    decoded = msgspec.json.decode(protocol.encode(msgspec.convert(
        msgspec.to_builtins(old), protocol.ChannelSnapshot)), type=protocol.ChannelSnapshot)
    assert decoded.direction is None and decoded.resultant_length.ci95 is None


# -- the dashboard ---------------------------------------------------------------------------

def test_the_dashboard_shows_the_direction_and_length_intervals(browser):
    roll = CircularOGPM(epsilon=6.0, origin=-math.pi)
    yaw = CircularOGPM(epsilon=0.5, period=360.0, origin=0.0)
    rng = np.random.default_rng(17)
    ingestor = Ingestor(fleet="demo", bins=20, window_seconds=10.0, keep_windows=4)
    now = time.time()
    readings = {"roll": (roll, rng.vonmises(TRUE_DIRECTION, 50.0, 4000)),
                "yaw": (yaw, rng.uniform(0.0, 360.0, 4000))}
    for channel, (mechanism, values) in readings.items():
        for seq, part in enumerate(np.array_split(mechanism.perturb_codes(values, rng), 4)):
            payload = protocol.report(agent="w1", channel=channel, kind="circular", seq=seq,
                                      t=now, dt=1.0, mechanism=mechanism.describe(),
                                      codes=part.tolist())
            assert ingestor.ingest(protocol.data_topic("demo", "w1", channel), payload,
                                   now) == "accepted"
    web = serve(Views(lambda: ingestor))
    board = Dashboard(browser, web)
    try:
        board.page.wait_for_selector(card("roll", "circular-half-width"), timeout=HANG_GUARD_MS)
        channels = strict_json(request(web, "GET", "/api/channels")[2])["channels"]
        stats = channels["roll"]
        direction, length = stats["direction"], stats["resultant_length"]
        assert direction["half_width"] is not None
        assert_shows(board, card("roll", "circular-mean"), stats["circular_mean"])
        assert_shows(board, card("roll", "circular-half-width"), direction["half_width"])
        assert_shows(board, card("roll", "direction-low"), direction["ci95"][0])
        assert_shows(board, card("roll", "direction-high"), direction["ci95"][1])
        assert_shows(board, card("roll", "resultant-estimate"), length["estimate"])
        assert_shows(board, card("roll", "resultant-stderr"), length["stderr"])
        assert_shows(board, card("roll", "resultant-low"), length["ci95"][0])
        assert_shows(board, card("roll", "resultant-high"), length["ci95"][1])
        degrees = board.text(card("roll", "circular-mean-deg"))
        assert "±" in degrees and degrees.count("°") == 2, degrees
        # Near-uniform angles: "any direction", and why.
        yaw_stats = channels["yaw"]
        assert yaw_stats["direction"]["half_width"] is None
        assert_shows(board, card("yaw", "circular-half-width"), None)
        reason = board.text(card("yaw", "circular-reason"))
        assert reason.startswith("any direction"), reason
        assert board.page.locator(card("roll", "circular-reason")).is_hidden() \
            or stats["circular_std_reason"]
        assert board.problems == []
    finally:
        board.close()
        web.stop()
