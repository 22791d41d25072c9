"""plan_spread = "auto": the fleet's spread and size from the collector's snapshots change
a planned channel's schedule when a budget period begins, never its share of the
guarantees (edge_agent.fleet_spreads, planning.replan_channel)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edge_agent import protocol
from edge_agent.agent import AgentCore
from edge_agent.config.planning import mean_error, replan_channel
from edge_agent.fleet_spreads import FleetSpreads
from edge_agent.protocol.snapshots import MAX_SNAPSHOT_BYTES
from edge_agent.state import NANO, StateStore
from tests.edge_agent.test_planning import LINEAR, T0, Steady, planned
from tests.support import FLEET, SimulatedTime

GUARANTEES = [{"epsilon": 4, "per": "10m"}, {"epsilon": 12, "per": "1h"}]
# Where the spread decides the schedule: ε 40 an hour, the plan per minute (at 4 per
# 10 minutes one report per 20 minutes serves every spread but the widest).
GENEROUS = [{"epsilon": 40, "per": "1h"}]
WIDTH = 4.0  # LINEAR's domain, [-2, 2]


def auto(tmp_path, guarantees=GUARANTEES, **privacy):
    return planned(tmp_path, guarantees, channels=[{**LINEAR, "mechanism": "pm-c"}],
                   sources=[{"name": "imu", "type": "jsonl"}], range_epsilon_max=0,
                   plan_spread="auto", **privacy)


def snapshot(spread, ci95, agents=1000, kind="linear", **extra) -> bytes:
    """The fields a planner reads of a channel's snapshot, among others it skips."""
    return json.dumps({"kind": kind, "channel": "ax", "agents": agents, "count": 5000,
                       "mean": {"estimate": 0.1}, "histogram": {"edges": [0, 1]},
                       "spread": {"estimate": spread, "ci95": ci95}, **extra}).encode()


@pytest.mark.parametrize("guarantees", [GUARANTEES, GENEROUS])
@pytest.mark.parametrize("spread", [0.001, 0.01, 0.05, 0.15, 0.3, 0.5])
@pytest.mark.parametrize("fleet", [10, 1000, 1_000_000])
def test_a_fleets_spread_changes_a_channels_spacing_never_its_share(tmp_path, guarantees,
                                                                     spread, fleet):
    """Planned again for any fleet, a channel keeps its shares of the guarantees: no
    window of any guarantee counts more of its ε than before; and the schedule is the
    one of least error for that fleet (no worse there than the first plan)."""
    config = auto(tmp_path, guarantees, plan_resolution="1m")
    first = config.plan.channels[0]
    again = replan_channel(config, "ax", spread=spread, fleet=fleet)
    assert again.shares == first.shares
    for h in range(len(config.plan.horizons)):
        assert again.spend(h) <= again.shares[h]
    resolution = config.plan.resolution

    def error(plan):
        return mean_error(plan.variance, resolution / plan.spacing, spread, plan.bias, fleet)

    assert error(again) <= error(first) * (1 + 1e-12)


def test_the_spread_decides_between_more_and_fewer_reports(tmp_path):
    """The trade-off the auto spread serves: a tight fleet is served best by few strong
    reports (a sample of the fleet in each window), a wide one by many weaker ones."""
    config = auto(tmp_path, GENEROUS, plan_resolution="1m")
    tight = replan_channel(config, "ax", spread=0.005, fleet=1000)
    wide = replan_channel(config, "ax", spread=0.5, fleet=1000)
    assert tight.spacing > wide.spacing and tight.epsilon > wide.epsilon


def test_snapshots_give_the_upper_end_of_the_spread_rounded_up_and_bounded(tmp_path):
    spreads = FleetSpreads(FLEET, {"ax": WIDTH})
    topic = protocol.aggregates_topic(FLEET, "ax")
    assert spreads.subscriptions == [topic]
    narrow = FleetSpreads(FLEET, {"ax": 1e-3})
    assert narrow.handle(topic, snapshot(1e308, [1e308, 1.7e308]))  # upper / width = inf
    assert narrow.latest["ax"][0] == 0.5
    assert spreads.handle(topic, snapshot(0.2, [0.15, 0.3], agents=1000))
    share, agents = spreads.latest["ax"]
    assert 0.3 / WIDTH <= share < 0.3 / WIDTH * 2 ** 0.25  # the upper end, rounded up
    assert 1000 / 2 ** 0.5 < agents <= 1000  # rounded down
    assert spreads.handle(topic, snapshot(50.0, [40.0, 60.0]))  # wider than the domain
    assert spreads.latest["ax"][0] == 0.5
    assert spreads.handle(topic, snapshot(1e308, [1e308, 1.7e308]))  # would overflow
    assert spreads.latest["ax"][0] == 0.5
    assert spreads.invalid == 0


@pytest.mark.parametrize("payload, reason", [
    (b"not json", "malformed"),
    (snapshot(0.2, [0.1, -0.3]), "out of range"),
    (snapshot(0.2, [0.1, 0.3], agents=0), "out of range"),
    (snapshot(0.2, [0.1, 0.3], agents=-1), "malformed"),
    (snapshot(0.2, [0.1, 0.3], kind="nonsense"), "malformed"),
    (b'{"kind": "linear", "agents": 3, "spread": {"estimate": 1}}', "malformed"),
    (b" " * (MAX_SNAPSHOT_BYTES + 1), "oversized"),
])
def test_a_bad_snapshot_is_refused_counted_and_changes_nothing(payload, reason):
    spreads = FleetSpreads(FLEET, {"ax": WIDTH})
    topic = protocol.aggregates_topic(FLEET, "ax")
    spreads.handle(topic, snapshot(0.2, [0.15, 0.3]))
    before = dict(spreads.latest)
    assert spreads.handle(topic, payload)
    assert spreads.invalid == 1, reason
    assert spreads.latest == before


def test_what_is_not_a_planned_linear_channels_snapshot_is_left_alone():
    spreads = FleetSpreads(FLEET, {"ax": WIDTH})
    assert not spreads.handle(protocol.range_result_topic(FLEET, "ax", "min"), b"{}")
    assert spreads.handle(protocol.aggregates_topic(FLEET, "other"), snapshot(0.2, [0.1, 0.3]))
    assert spreads.handle(protocol.aggregates_topic(FLEET, "ax"), b"")  # cleared
    assert spreads.handle(protocol.aggregates_topic(FLEET, "ax"),
                          snapshot(0.2, [0.1, 0.3], kind="circular"))
    assert spreads.latest == {} and spreads.invalid == 0


def test_the_new_schedule_starts_at_a_period_and_no_window_holds_more_than_the_share(
        tmp_path):
    """Three hours of one-second batches (period: the longest guarantee, an hour), the
    collector's snapshot saying the fleet is tight: the channel keeps the first plan
    until the next period begins, then reports on the new one; the ledger refuses
    nothing, and the channel's own ε in every sliding window of either guarantee stays
    within its share (the gap at the switch), through the real ledger."""
    config = auto(tmp_path, GENEROUS, plan_resolution="1m")
    first = config.plan.channels[0]
    spreads = FleetSpreads(FLEET, {"ax": WIDTH})
    assert spreads.handle(protocol.aggregates_topic(FLEET, "ax"),
                          snapshot(0.1, [0.08, 0.12], agents=1000))
    new = spreads.plan(config, "ax")
    assert new.spacing != first.spacing
    clock = SimulatedTime(T0)
    store = StateStore(tmp_path / "state.sqlite", monotonic=clock.monotonic,
                       boot_id=clock.boot_id)
    core = AgentCore(config, store, sources={"imu": Steady()}, rng=np.random.default_rng(1))
    core.fleet_spreads = spreads
    channel = core.channels[0]
    charges, reported, switched = [], 0, None
    for _ in range(3 * 3600):
        now = clock.advance(1.0)
        core.tick(now)
        if switched is None and channel.spacing != first.spacing:
            switched = now
        if channel.counters["reports"] > reported:
            charges.append((now, channel.charge_nano, channel.spacing))
            reported = channel.counters["reports"]
    store.close()
    period = config.privacy.period_seconds
    assert switched is not None and switched % period < 2.0  # at a period's start
    assert channel.spacing == new.spacing and channel.epsilon == new.epsilon
    assert channel.local["budget_refused"] == 0
    times = np.array([t for t, _, _ in charges])
    nano = np.array([n for _, n, _ in charges])
    before, after = times < switched, times >= switched
    assert np.diff(times[before]).min() >= first.spacing - 1.0
    assert np.diff(times[after]).min() >= new.spacing - 1.0
    assert times[after][0] - times[before][-1] >= first.spacing + new.spacing - 1.0
    cumulative = np.concatenate([[0], np.cumsum(nano)])
    for h, horizon in enumerate(config.plan.horizons):
        start = np.searchsorted(times, times - float(horizon.counted), side="right")
        in_window = cumulative[np.arange(times.size) + 1] - cumulative[start]
        assert in_window.max() <= first.shares[h], horizon.per
    assert nano[after][0] == pytest.approx(new.epsilon * NANO, rel=1e-6)
