"""Vector channels with a mechanism of whole vectors (duchi-vector, sampled-duchi,
Wang et al. arXiv:1906.01777 Algorithms 1 and 3): configuration errors name the key, the
channel writes the mechanism's wire form, and the real ledger charges each reading the
mechanism's exact epsilon (its exact loss, or epsilon when delta > 0) and exact delta,
rounded up."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from edge_agent import protocol
from edge_agent.agent import AgentCore, budget_of
from edge_agent.channels import Selection, build_channel
from edge_agent.config import ConfigError, parse_config
from edge_agent.config.planning import report_variance
from edge_agent.mechanisms.multidimensional import DuchiVector, SampledDuchi
from edge_agent.readings import Readings
from edge_agent.sources.base import Source
from edge_agent.state import DELTA_UNIT, NANO, StateStore, delta_units_up, to_nano_up
from tests.support import SimulatedTime, agent_config

DAY = 86400.0
FIELDS = ["accel_x", "accel_y", "accel_z"]
ACC = {"name": "acc", "source": "imu", "kind": "vector", "fields": FIELDS, "epsilon": 2.0,
       "domain": [-4.0, 4.0], "mechanism": "duchi-vector"}


def _config(privacy=None, budget=1e6, **changes):
    return parse_config(agent_config(state_dir="/tmp/unused", budget=budget,
                                     channels=[{**ACC, **changes}], privacy=privacy))


def _channel(privacy=None, **changes):
    if changes.get("delta") and privacy is None:
        privacy = {"budget_delta": 0.01}
    config = _config(privacy=privacy, **changes)
    return build_channel(config.channels[0], agent_id="w1", fleet="demo")


def _error(privacy=None, **changes) -> str:
    with pytest.raises(ConfigError) as info:
        _config(privacy=privacy, **changes)
    return str(info.value)


@pytest.mark.parametrize("changes, message", [
    (dict(strategy="split"), "channels[0]: strategy: duchi-vector reports whole vectors"),
    (dict(mechanism="sampled-duchi", strategy="sample", k=1), "strategy: sampled-duchi "
                                                              "reports whole vectors"),
    (dict(k=2), "k: duchi-vector reports every axis (sampled-duchi reports k of them)"),
    (dict(mechanism="sampled-duchi", k=4), "k: must be in [1, 3], got 4"),
    (dict(mechanism="sampled-duchi", k=0), "channels[0].k: must be >= 1, got 0"),
    (dict(mechanism="pm", delta=1e-6), "delta: only duchi-vector and sampled-duchi take a "
                                       "delta, not 'pm'"),
    (dict(delta=0.2), "channels[0].delta: must be <= 0.1, got 0.2"),
    (dict(delta=-1e-9), "channels[0].delta: must be >= 0"),
    (dict(delta=1e-6), "channels[0].delta: 1e-06 needs a delta budget: set "
                       "privacy.budget_delta"),
    (dict(mechanism="duchi-vectors"), "channels[0].mechanism"),
    (dict(fields=[f"f{i}" for i in range(63)]), "fields: duchi-vector takes at most 62 axes, "
                                                "got 63"),
    (dict(epsilon=1e-6), "channels[0].epsilon"),
    (dict(domain=[-1e305, 1e305], epsilon=1e-5), "channels[0]: its mechanism refuses it: "
                                                 "low, high: [-1e+305, 1e+305] is too wide"),
])
def test_configuration_errors_name_the_key(changes, message):
    assert message in _error(**changes)


def test_a_planned_channel_is_pure_and_the_planner_knows_its_variance():
    planned = {**ACC, "epsilon": None}
    del planned["epsilon"]
    for mechanism in ("duchi-vector", "sampled-duchi"):
        config = parse_config(agent_config(
            state_dir="/tmp/unused", budget=None,
            privacy={"plan": "auto", "guarantees": [{"epsilon": 4.0, "per": "1h"}]},
            channels=[{**planned, "mechanism": mechanism}]))
        channel = config.channels[0]
        assert channel.epsilon is not None
        built = build_channel(channel, agent_id="w1", fleet="demo")
        assert built.privacy_loss().at_most(Fraction(channel.epsilon))
        # An axis' mean over [-4, 4]: B² / 4 (duchi-vector), d/k B_axis² / 4 (sampled).
        mech = built.mechanism
        expected = float(mech.components[0].variance(0.0)) / 64.0 * 3 / built.k
        assert report_variance(channel, channel.epsilon) == pytest.approx(expected)
    with pytest.raises(ConfigError, match=r"channels\[0\].delta: the planner plans pure"):
        parse_config(agent_config(
            state_dir="/tmp/unused", budget=None,
            privacy={"plan": "auto",
                     "guarantees": [{"epsilon": 4.0, "per": "1h", "delta": 1e-3}]},
            channels=[{**planned, "delta": 1e-6}]))


@pytest.mark.parametrize("mechanism, k", [("duchi-vector", 3), ("sampled-duchi", 2),
                                          ("sampled-duchi", None)])
def test_the_channel_writes_the_mechanisms_codes(mechanism, k):
    channel = _channel(mechanism=mechanism, **({"k": k} if mechanism == "sampled-duchi" and k
                                               else {}))
    expected = DuchiVector(epsilon=2.0, dimensions=3, low=-4.0, high=4.0) \
        if mechanism == "duchi-vector" else SampledDuchi(epsilon=2.0, dimensions=3, k=k,
                                                         low=-4.0, high=4.0)
    assert channel.mechanism == expected
    assert channel.k == expected.k if mechanism == "sampled-duchi" else channel.k == 3
    n = 40
    values = (np.linspace(-5, 5, n), np.zeros(n), np.full(n, 3.0))  # 4 of -5..5 outside
    selection = Selection(np.arange(n, dtype=float), values)
    topic, payload = channel.build_message(selection, seq=0, allowed=n, t=1.7e9, dt=1.0,
                                           rng=np.random.default_rng(3))
    report = protocol.decode_report(topic, payload, "demo")
    assert report.mechanism == expected and report.fields == tuple(FIELDS)
    assert (report.strategy.k, report.strategy.d, report.strategy.epsilon) == (channel.k, 3,
                                                                               2.0)
    sizes = [part.size for part in report.codes]
    assert sizes == [n] * 3 if mechanism == "duchi-vector" else sum(sizes) == channel.k * n
    assert channel.local["clipped"] == 8 and channel.counters["reports"] == n
    channel.warm_up()


@pytest.mark.parametrize("mechanism", ["duchi-vector", "sampled-duchi"])
def test_pure_channels_charge_their_exact_loss_and_delta_channels_epsilon_and_delta(mechanism):
    pure = _channel(mechanism=mechanism)
    loss = pure.mechanism.exact_privacy_loss()
    assert pure.privacy_loss() == loss  # one report of the mechanism per reading
    assert pure.charge_nano == loss.ceiling(NANO) <= 2 * NANO and pure.charge_delta == 0
    approximate = _channel(mechanism=mechanism, delta=1e-6)
    assert approximate.charge_nano == to_nano_up(2.0)
    exact = approximate.mechanism.exact_delta()
    assert 0 < exact <= 1e-6
    assert approximate.charge_delta == delta_units_up(exact) <= delta_units_up(1e-6)


class VectorSource(Source):
    """``per_poll`` readings of three axes a poll."""

    def __init__(self, per_poll=4):
        super().__init__("imu")
        self.per_poll = per_poll

    def poll(self, now):
        times = now - 1 + (np.arange(self.per_poll) + 1) / self.per_poll
        columns = {name: np.full(self.per_poll, 0.5 * i) for i, name in enumerate(FIELDS)}
        return Readings(times, columns)


@pytest.mark.parametrize("mechanism", ["duchi-vector", "sampled-duchi"])
def test_the_real_ledger_charges_epsilon_and_delta_per_reading_until_delta_binds(
        tmp_path, mechanism):
    probe = _channel(mechanism=mechanism, delta=1e-6)
    per_report = probe.charge_delta
    # A delta budget of 5 readings and a bit: epsilon (100) allows 50 of them.
    budget_delta = (Fraction(5 * per_report) + Fraction(1, 2)) / DELTA_UNIT
    config = parse_config(agent_config(
        state_dir=tmp_path, budget=100.0, period="1d", batch_seconds=1.0,
        privacy={"budget_delta": float(budget_delta)},
        channels=[{**ACC, "mechanism": mechanism, "delta": 1e-6}]))
    assert budget_of(config).limits[0].delta == 5 * per_report  # rounded down, exactly
    clock = SimulatedTime(10 * DAY + 100.0)
    store = StateStore(tmp_path / "state.sqlite", monotonic=clock.monotonic)
    core = AgentCore(config, store, sources={"imu": VectorSource(per_poll=4)},
                     rng=np.random.default_rng(0))
    for _ in range(4):
        core.tick(clock.advance(1))
    sent = [protocol.decode_report(topic, payload, "demo")
            for _, topic, payload, _ in store.pending(0, 100)]
    readings = sum(part.size for report in sent for part in report.codes) \
        // (3 if mechanism == "duchi-vector" else probe.k)
    assert readings == 5  # 4 + 1: delta ran out
    assert store.spent_delta("w1", DAY, clock.wall) == 5 * per_report
    assert store.spent("w1", DAY, clock.wall) == 5 * to_nano_up(2.0)
    store.close()
