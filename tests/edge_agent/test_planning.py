"""The planner (privacy.plan = "auto", edge_agent.config.planning): every channel reports, the
schedule's worst case per guarantee is the guarantee exactly and never more, through the
real ledger; the choice follows the exact variance (the issue's PM figures)."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from edge_agent.agent import AgentCore
from edge_agent.channels import build_channels
from edge_agent.config import ConfigError, parse_config
from edge_agent.config.planning import (
    counts,
    every_minute_error,
    horizons_of,
    mean_error,
)
from edge_agent.mechanisms import linear_mechanism
from edge_agent.readings import Readings
from edge_agent.sources.base import Source
from edge_agent.state import NANO, StateStore
from tests.support import SimulatedTime, agent_config

T0 = 1_800_000_000.0
IMU = {"name": "imu", "type": "synthetic", "rate_hz": 50}
LINEAR = {"name": "ax", "kind": "linear", "source": "imu", "field": "accel_x",
          "domain": [-2.0, 2.0]}
CIRCULAR = {"name": "roll", "kind": "circular", "source": "imu", "field": "roll"}
POLAR = {"name": "hm", "kind": "polar", "source": "imu",
         "fields": ["accel_h_mag", "accel_h_dir"], "radius_max": 2.0}
VECTOR = {"name": "v", "kind": "vector", "source": "imu",
          "fields": ["accel_x", "accel_y", "accel_z"], "domain": [-2.0, 2.0]}
CATEGORICAL = {"name": "act", "kind": "categorical", "source": "imu", "field": "activity",
               "categories": ["rest", "walk", "run"]}
ALL = [LINEAR, CIRCULAR, POLAR, VECTOR, CATEGORICAL]


def planned(tmp_path, guarantees, channels=ALL, sources=(IMU,), **privacy):
    return parse_config(agent_config(
        state_dir=tmp_path, budget=None, batch_seconds=1.0, sources=sources,
        channels=channels, privacy={"guarantees": guarantees, **privacy}))


GUARANTEE_SETS = {
    "10m": [{"epsilon": 4, "per": "10m"}],
    "10m+1d": [{"epsilon": 4, "per": "10m"}, {"epsilon": 120, "per": "1d"}],
    "1m+1h+1d": [{"epsilon": 2, "per": "1m"}, {"epsilon": 30, "per": "1h"},
                 {"epsilon": 200, "per": "1d"}],
    "1h": [{"epsilon": 8, "per": "1h"}],
}


@pytest.mark.parametrize("name", GUARANTEE_SETS)
def test_the_worst_case_of_every_guarantee_is_at_most_it_and_the_binding_one_exactly(
        tmp_path, name):
    config = planned(tmp_path, GUARANTEE_SETS[name])
    plan = config.plan
    channels = build_channels(config, "w1")
    assert [c.spacing for c in channels] == [p.spacing for p in plan.channels]
    for i, horizon in enumerate(plan.horizons):
        # What the ledger charges (each channel's exact loss, rounded up), times the most
        # reports any window of the guarantee counts at the channel's spacing.
        worst = sum(counts(c.spacing, plan.horizons)[i] * c.charge_nano for c in channels)
        assert worst + plan.reserve_nano <= horizon.nano
    for channel, p in zip(channels, plan.channels):
        assert channel.charge_nano <= round(p.epsilon * NANO)
        # Its epsilon is the largest its share allows at its counts: the binding
        # guarantee is spent exactly (to the nano-epsilon the ledger counts in).
        assert min(share // n for share, n in zip(p.shares, p.counts)) == round(p.epsilon * NANO)
        assert any(share - n * round(p.epsilon * NANO) < n for share, n in zip(p.shares, p.counts))
    # the shares are the whole of each guarantee but the range reserve
    for i, horizon in enumerate(plan.horizons):
        assert horizon.nano - plan.reserve_nano - len(channels) < sum(
            p.shares[i] for p in plan.channels) <= horizon.nano - plan.reserve_nano


def test_counts_are_the_most_reports_spaced_that_far_in_any_window_the_ledger_counts():
    horizons = horizons_of(parse_config(agent_config(
        state_dir="/tmp/unused", budget=None, privacy={"guarantees": GUARANTEE_SETS["1m+1h+1d"]},
        channels=[{**LINEAR, "epsilon": 0.1}])).privacy.horizons)
    rng = np.random.default_rng(5)
    for spacing in (1.0, 7.3, 60.0, 61.0, 900.0, 3600.0 + 3):
        n = counts(spacing, horizons)
        # reports at least `spacing` apart, jittered later (batch times)
        times = np.cumsum(spacing + rng.exponential(0.01 * spacing, 200_000))
        for h, most in zip(horizons, n):
            span = float(h.window + h.bucket)
            # a report counts in the windows ending within `span` after it (half-open)
            inside = np.searchsorted(times, times + span, side="left") - np.arange(times.size)
            assert inside[: times.size // 2].max() <= most
    # exactly spaced, a window holds that many
    assert counts(float(Fraction(601, 2)), horizons)[0] == 1
    assert counts(60.0, horizons)[0] == 2  # 60 s + the 1 s bucket


def test_the_issue_figures_population_division_four_times_better_at_eps4_per_10_slots(tmp_path):
    """PM on [-1, 1], spread 0.3, 1,000 devices, 1-minute slots: ε = 4 per 10 slots gives
    0.171 at ε/w every slot against 0.043 once per window at full ε (issue 28, from PM's
    variance x²/(e^(ε/2)-1) + (e^(ε/2)+3)/(3(e^(ε/2)-1)²), Wang et al. 2019, at the data's
    x² = 0.09).  The planner judges by the worst case (x = ±1), which it must survive."""
    config = planned(tmp_path, [{"epsilon": 4, "per": "10m"}],
                     channels=[{**LINEAR, "mechanism": "pm-c", "domain": [-1.0, 1.0]}],
                     range_epsilon_max=0, plan_resolution="1m")
    (p,) = config.plan.channels
    assert p.counts == (1,) and p.epsilon == pytest.approx(4.0, abs=1e-9)
    assert 600 < p.spacing < 602  # one report per window (+ the bucket), at full epsilon

    def pm_variance(epsilon, x2):  # in units of the width squared (4)
        e = math.exp(epsilon / 2)
        return (x2 / (e - 1) + (e + 3) / (3 * (e - 1) ** 2)) / 4

    def rmse(variance, spacing):
        return mean_error(variance, 60.0 / spacing, 0.15, 0.0, 1000) * 2

    # the issue's table, from the same error model
    assert rmse(pm_variance(4.0, 0.09), 600.0) == pytest.approx(0.043, abs=0.001)
    assert rmse(pm_variance(0.4, 0.09), 60.0) == pytest.approx(0.171, abs=0.001)
    # the planner's own figures: the worst case, by the exact (gridded) variance
    assert p.variance == pytest.approx(pm_variance(4.0, 1.0), rel=0.01)
    assert p.error == pytest.approx(
        mean_error(pm_variance(4.0, 1.0), 60.0 / p.spacing, 0.15, 0.0, 1000), rel=0.01)
    assert config.plan.error(p, expected=False) == p.error
    every_slot = every_minute_error(config.channels[0], config.plan, p)
    assert every_slot == pytest.approx(mean_error(pm_variance(0.4, 1.0), 1.0, 0.15, 0.0, 1000),
                                       rel=0.01)
    assert every_slot / p.error > 3
    # what a fleet of that spread around the middle can expect: the data's x² = 0.09
    assert p.expected_variance == pytest.approx(pm_variance(4.0, 0.09), rel=0.05)


def test_a_mechanism_with_bounded_reports_spreads_when_the_fleet_spreads_widely(tmp_path):
    """The choice follows the numbers: at ε = 8 per 10 slots, a fleet spread over half
    the domain makes sampling error dominate, so the planner spreads reports (and the
    slot error of its choice is the least over the candidates).  PM-C: OGPM's flat ends
    widen as ε per report falls, and their bias, which no number of reports removes,
    keeps it from spreading (the next test)."""
    compressed = {**LINEAR, "mechanism": "pm-c"}
    narrow = planned(tmp_path, [{"epsilon": 8, "per": "10m"}], channels=[compressed],
                     range_epsilon_max=0, plan_spread=0.05,
                     plan_resolution="1m").plan.channels[0]
    wide = planned(tmp_path, [{"epsilon": 8, "per": "10m"}], channels=[compressed],
                   range_epsilon_max=0, plan_spread=0.5, plan_resolution="1m").plan.channels[0]
    assert wide.spacing < narrow.spacing
    assert wide.counts[0] > narrow.counts[0]
    assert mean_error(wide.variance, 60.0 / wide.spacing, 0.5, 0.0, 1000) == pytest.approx(
        wide.error)
    assert wide.bias < 1e-20  # PM-C is affine over the whole domain


def test_the_planner_weighs_ogpm_flat_end_bias_as_auto_does(tmp_path):
    """OGPM's worst bias over the domain (a fleet at an end is estimated at its flat
    region's edge, Theorem 3.7) enters the slot error for 1,000 wearers: B² is the flat
    region's width squared (in widths), and it keeps the wide fleet from spreading."""
    wide = planned(tmp_path, [{"epsilon": 8, "per": "10m"}], channels=[LINEAR],
                   range_epsilon_max=0, plan_spread=0.5, plan_resolution="1m").plan.channels[0]
    mechanism = linear_mechanism("ogpm", epsilon=wide.epsilon, low=-2.0, high=2.0,
                                 grid_bits=10)
    flat = (mechanism.affine_mean()[2] + 2.0) / 4.0
    assert wide.bias == pytest.approx(flat**2, rel=1e-3) and wide.bias > 0
    m = 60.0 / wide.spacing
    assert mean_error(wide.variance, m, 0.5, wide.bias, 1000) == pytest.approx(wide.error)
    assert wide.error**2 == pytest.approx(mean_error(wide.variance, m, 0.5, 0.0, 1000) ** 2
                                          + wide.bias)
    assert wide.counts == (1,)  # one report per window, at the full epsilon


# -- the schedule through the real ledger ---------------------------------------------------

class Steady(Source):
    """One reading per second of every field (values irrelevant to the schedule)."""

    FIELDS = ("accel_x", "accel_y", "accel_z", "roll", "accel_h_mag", "accel_h_dir")

    def __init__(self):
        super().__init__("imu")
        self.last = None

    def poll(self, now):
        start = now - 1.0 if self.last is None else self.last
        self.last = now
        times = np.arange(math.floor(start) + 1.0, math.floor(now) + 1.0)
        columns = {f: np.full(times.size, 0.5) for f in self.FIELDS}
        columns["accel_h_mag"] = np.full(times.size, 1.0)
        return Readings(times, columns, {"activity": np.full(times.size, "walk", dtype=object)})


def test_every_channel_reports_on_schedule_and_no_window_exceeds_its_guarantee(tmp_path):
    """Three hours of one-second batches under 4 per 10 minutes and 12 per hour, the agent
    restarted half-way (a new phase): every channel reports about every spacing, the
    ledger refuses nothing before the restart, and the spending summed over every sliding
    window of either length stays within it, through the real ledger."""
    guarantees = [{"epsilon": 4, "per": "10m"}, {"epsilon": 12, "per": "1h"}]
    config = planned(tmp_path, guarantees, sources=[{"name": "imu", "type": "jsonl"}])
    clock = SimulatedTime(T0)
    charges = []  # (time, nano) of every report
    seen: dict[str, int] = {}
    cores = []
    for run in range(2):
        store = StateStore(tmp_path / "state.sqlite", monotonic=clock.monotonic,
                           boot_id=clock.boot_id)
        core = AgentCore(config, store, sources={"imu": Steady()},
                         rng=np.random.default_rng(run))
        for _ in range(90 * 60):
            now = clock.advance(1.0)
            core.tick(now)
            for channel in core.channels:
                key = f"{run}/{channel.name}"
                if channel.counters["reports"] > seen.get(key, 0):
                    charges.append((now, channel.charge_nano))
                    seen[key] = channel.counters["reports"]
        store.close()
        cores.append(core)
    for i, p in enumerate(config.plan.channels):
        first, second = cores[0].channels[i], cores[1].channels[i]
        assert first.local["budget_refused"] == 0, p.name
        expected = 3 * 3600 / p.spacing
        reported = first.counters["reports"] + second.counters["reports"]
        assert expected - 3 <= reported <= expected + 2, p.name
    times = np.array([t for t, _ in charges])
    nano = np.array([n for _, n in charges])
    cumulative = np.concatenate([[0], np.cumsum(nano)])
    for g in guarantees:
        window = {"10m": 600, "1h": 3600}[g["per"]]
        start = np.searchsorted(times, times - window, side="right")
        in_window = cumulative[np.arange(times.size) + 1] - cumulative[start]
        assert in_window.max() <= g["epsilon"] * NANO - config.plan.reserve_nano


# -- configuration --------------------------------------------------------------------

def test_plan_defaults_to_auto_without_epsilons_and_to_manual_with_them(tmp_path):
    assert planned(tmp_path, GUARANTEE_SETS["10m"], channels=[LINEAR]).plan is not None
    manual = parse_config(agent_config(state_dir=tmp_path, channels=[{**LINEAR, "epsilon": 1}]))
    assert manual.plan is None and not manual.planned
    assert manual.range_epsilon_limit == 4.0
    assert planned(tmp_path, GUARANTEE_SETS["10m"], channels=[LINEAR]).range_epsilon_limit == 1.0


@pytest.mark.parametrize("channels, privacy, key", [
    ([{**LINEAR, "epsilon": 1}, CIRCULAR], {}, "channels[1].epsilon: missing"),
    ([{**LINEAR, "epsilon": 1}], {"plan": "auto"}, "channels[0].epsilon: set by the planner"),
    ([LINEAR], {"plan": "manual"}, "channels[0].epsilon: missing"),
    ([{**LINEAR, "report_interval": 60}], {}, "channels[0].report_interval: the planner"),
    ([{**CATEGORICAL, "delta": 1e-9}], {}, "channels[0].delta: the planner plans pure"),
    ([LINEAR], {"range_epsilon_max": 4}, "privacy.range_epsilon_max: 4 kept for range"),
    ([LINEAR, {**CIRCULAR, "plan_weight": 1e-6}], {"range_epsilon_max": 0,
                                                    "guarantees": [{"epsilon": 1e-3,
                                                                    "per": "1m"}]},
     "channels[1].plan_weight: its share"),
])
def test_what_the_planner_cannot_serve_is_a_config_error_naming_the_key(tmp_path, channels,
                                                                         privacy, key):
    privacy = {"guarantees": GUARANTEE_SETS["10m"], **privacy}
    with pytest.raises(ConfigError) as error:
        parse_config(agent_config(state_dir=tmp_path, budget=None, channels=channels,
                                  privacy=privacy))
    assert key in str(error.value)


def test_weights_share_the_guarantees(tmp_path):
    even = planned(tmp_path, GUARANTEE_SETS["10m"], channels=[LINEAR, CIRCULAR]).plan
    heavy = planned(tmp_path, GUARANTEE_SETS["10m"],
                    channels=[{**LINEAR, "plan_weight": 3}, CIRCULAR]).plan
    assert even.channels[0].shares == even.channels[1].shares
    assert heavy.channels[0].shares[0] == 3 * heavy.channels[1].shares[0]
    assert heavy.channels[0].error < even.channels[0].error


# -- the error a study can expect, against a simulated fleet ----------------------------------

def simulated_hourly_rmse(plan, planned_channel, mechanism, *, fleet: int, hours: int,
                          seed: int) -> float:
    """The RMSE of the unbiased estimate of a fleet's mean over an hour, simulated as the
    agents and the collector make it: ``fleet`` wearers, readings drawn from the plan's
    fleet shape (normal around the middle, cut to the domain), each reporting at its
    spacing from a random phase, every report perturbed by the real mechanism and
    inverted through its affine mean; the truth is the mean of every wearer's reading."""
    rng = np.random.default_rng(seed)
    low, high = mechanism.low, mechanism.high
    width = high - low
    slope, intercept = mechanism.affine_mean()[:2]
    spacing = planned_channel.spacing
    errors = np.empty(hours)
    for hour in range(hours):
        readings = np.clip(rng.normal((low + high) / 2, plan.shape.spread * width, fleet),
                           low, high)
        phase = rng.uniform(0.0, spacing, fleet)
        reports = np.where(phase < 3600.0, np.floor((3600.0 - phase) / spacing) + 1, 0)
        values = np.repeat(readings, reports.astype(np.int64))
        outputs = mechanism.from_codes(mechanism.perturb_codes(values, rng))
        estimate = float(np.mean((outputs - intercept) / slope))
        errors[hour] = (estimate - readings.mean()) / width
    return math.sqrt(float(np.mean(errors ** 2)))


@pytest.mark.parametrize("fleet", [100, 1000, 10_000])
@pytest.mark.parametrize("mechanism", ["ogpm", "pm-c"])
def test_the_stated_hourly_error_is_what_a_simulated_fleet_measures(tmp_path, fleet, mechanism):
    """``Plan.error`` per hour (expected for the plan's fleet shape) within 20% of the
    error a fleet of that size measures, at 3 fleet sizes, one report per wearer every
    few minutes (m > 1 an hour) and one every few hours (m < 1: a sample of the fleet
    each hour).  400 simulated hours: the measured RMSE's own relative error is about
    1 / sqrt(2 x 400) = 3.5%, so 20% is more than 5 of its standard deviations."""
    for guarantees, reports in (([{"epsilon": 4, "per": "10m"}], "several an hour"),
                                ([{"epsilon": 2, "per": "6h"}], "fewer than one an hour")):
        config = planned(tmp_path, guarantees,
                         channels=[{**LINEAR, "mechanism": mechanism, "domain": [-1.0, 1.0]}],
                         range_epsilon_max=0, plan_fleet=fleet)
        plan = config.plan
        (p,) = plan.channels
        assert (p.reports_per(3600.0) > 1) == (reports == "several an hour")
        real = linear_mechanism(mechanism, epsilon=p.epsilon, low=-1.0, high=1.0, grid_bits=12)
        measured = simulated_hourly_rmse(plan, p, real, fleet=fleet, hours=400, seed=fleet)
        stated = plan.error(p, 3600.0)
        assert stated == pytest.approx(measured, rel=0.2), (reports, p.epsilon, p.spacing)


def test_the_fleet_for_a_target_is_the_fewest_that_reach_it(tmp_path):
    """``Plan.fleet_for``: that many wearers reach the target per plan resolution, one
    fewer do not; a target the flat ends' bias alone exceeds has no fleet size; more
    wearers, less error, as 1 / sqrt(N) without bias."""
    config = planned(tmp_path, GUARANTEE_SETS["10m+1d"],
                     channels=[{**LINEAR, "mechanism": "pm-c"}], range_epsilon_max=0,
                     plan_target=0.02)
    plan = config.plan
    (p,) = plan.channels
    needed = plan.fleet_for(p)
    assert plan.error(p, fleet=needed) <= 0.02 < plan.error(p, fleet=needed - 1)
    assert plan.error(p, fleet=4 * needed) == pytest.approx(plan.error(p, fleet=needed) / 2,
                                                            rel=0.01)
    assert plan.fleet_for(p, expected=False) >= needed  # the worst case needs more
    biased = planned(tmp_path, [{"epsilon": 0.5, "per": "1d"}], channels=[LINEAR],
                     range_epsilon_max=0, plan_spread=0.5).plan
    (q,) = biased.channels
    assert q.bias > 0
    assert biased.fleet_for(q, math.sqrt(q.bias) * 0.9, expected=False) is None
    with pytest.raises(ValueError, match="target: give one"):
        biased.fleet_for(q)  # no plan_target, none given


@pytest.mark.parametrize("guarantees, spread", [("10m+1d", 0.5), ("1h", 0.5)])
def test_the_plan_is_chosen_for_the_resolution_a_study_reads(tmp_path, guarantees, spread):
    """The same guarantees give a study that reads minutes and one that reads hours or
    days different schedules (a wide fleet read by the minute needs more wearers in each
    minute: reports spread thinner), and each errs least at its own resolution."""
    plans = {r: planned(tmp_path, GUARANTEE_SETS[guarantees],
                        channels=[{**LINEAR, "mechanism": "pm-c"}], range_epsilon_max=0,
                        plan_resolution=r, plan_spread=spread).plan
             for r in ("1m", "1h", "1d")}
    assert len({plan.channels[0].spacing for plan in plans.values()}) > 1
    for own, seconds in (("1m", 60.0), ("1h", 3600.0), ("1d", 86400.0)):
        chosen = plans[own]
        for other in plans.values():
            assert chosen.error(chosen.channels[0], seconds, expected=False) <= \
                chosen.error(other.channels[0], seconds, expected=False) * (1 + 1e-12)


def test_plan_slot_is_read_as_plan_resolution_and_not_with_it(tmp_path):
    config = planned(tmp_path, GUARANTEE_SETS["10m"], channels=[LINEAR], plan_slot="10m")
    assert config.plan.resolution == 600.0
    with pytest.raises(ConfigError, match="privacy.plan_slot"):
        planned(tmp_path, GUARANTEE_SETS["10m"], channels=[LINEAR], plan_slot="10m",
                plan_resolution="1h")


@pytest.mark.parametrize("key, value", [("plan_fleet", 0), ("plan_target", 0.0),
                                        ("plan_target", 1.0), ("plan_resolution", "30s"),
                                        ("plan_fleet", "many")])
def test_bad_plan_settings_are_errors_naming_the_key(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"privacy.{key}"):
        planned(tmp_path, GUARANTEE_SETS["10m"], channels=[LINEAR], **{key: value})
