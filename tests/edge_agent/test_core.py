"""AgentCore and AgentService logic: scripted sources, an injected clock, a fake transport."""

from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np

from edge_agent import protocol
from edge_agent.agent import AgentCore, AgentService
from edge_agent.channels import Channel
from edge_agent.config import parse_config
from edge_agent.readings import Readings
from edge_agent.sources.base import Source
from edge_agent.state import DELTA_UNIT, StateStore
from tests.support import AX_CHANNEL, FakeTransport, SimulatedTime, agent_config

DAY = 86400.0


class ScriptedSource(Source):
    """Hands out a fixed number of readings per poll; finite after ``polls`` polls."""

    def __init__(self, name="imu", *, per_poll=3, polls=None, value=0.5, nan_every=0):
        super().__init__(name)
        self.per_poll, self.polls, self.value, self.nan_every = per_poll, polls, value, nan_every
        self.count = 0

    def poll(self, now):
        if self.polls is not None and self.count >= self.polls:
            self.finished = True
            return Readings.empty()
        self.count += 1
        values = np.full(self.per_poll, self.value)
        if self.nan_every:
            values[::self.nan_every] = np.nan
        times = now - 1 + (np.arange(self.per_poll) + 1) / self.per_poll
        if self.polls is not None and self.count >= self.polls:
            self.finished = True
        return Readings(times, {"accel_x": values})


def make_config(tmp_path, budget=5.0, period="1d", privacy=None, **channel):
    """One linear channel ``ax`` (changed by ``channel``), a small budget, 1 s batches;
    ``privacy``: more [privacy] keys."""
    return parse_config(agent_config(state_dir=tmp_path, budget=budget, period=period,
                                     batch_seconds=1.0, channels=[{**AX_CHANNEL, **channel}],
                                     privacy=privacy))


def messages(store):
    return [json.loads(p) for _, _, p, _ in store.pending(0, 10_000)]


def test_budget_exhaustion_logged_once_and_the_rolling_window_frees_it(tmp_path, caplog):
    config = make_config(tmp_path, budget=5.0)
    clock = SimulatedTime(10 * DAY + 100.0)
    store = StateStore(tmp_path / "state.sqlite", monotonic=clock.monotonic)
    core = AgentCore(config, store, sources={"imu": ScriptedSource(per_poll=3)},
                     rng=np.random.default_rng(0))
    caplog.set_level(logging.INFO)
    core.tick(clock.wall)
    core.tick(clock.advance(1))  # 3 wanted, 2 fit: the budget of 5 is gone
    core.tick(clock.advance(1))
    core.tick(clock.advance(1))
    sent = messages(store)
    assert [len(m["codes"]) for m in sent] == [3, 2]
    assert [m["seq"] for m in sent] == [0, 1]
    assert store.spent("w1", DAY, clock.wall) == 5 * 10**9
    exhausted = [r for r in caplog.records if "budget exhausted" in r.getMessage()]
    assert len(exhausted) == 1 and "ax" in exhausted[0].getMessage()
    status = core.status()
    assert status["channels"]["ax"] == {"exhausted": True, "reports": 5, "messages": 2}
    assert core.local_status()["channels"]["ax"]["budget_refused"] == 1 + 3 + 3
    assert status["budget"]["spent"] == 5.0
    # Just under a day after the first reports: still exhausted.
    core.tick(clock.advance(DAY - 5))
    assert len(messages(store)) == 2
    # A day and a bucket after them: reporting resumes, the sequence continues.
    core.tick(clock.advance(3 + 60))
    sent = messages(store)
    assert [m["seq"] for m in sent] == [0, 1, 2] and len(sent[-1]["codes"]) == 3
    assert core.status()["channels"]["ax"]["exhausted"] is False
    assert any("ax reports again" in r.getMessage() for r in caplog.records)


def test_the_delta_budget_binds_and_the_status_shows_it(tmp_path, monkeypatch):
    # Every report of every channel costs 300 units of delta here (an (epsilon, delta)
    # channel's charge_delta); a delta budget of 1e-12 holds 3 of them.
    monkeypatch.setattr(Channel, "charge_delta", property(lambda self: 300))
    config = make_config(tmp_path, budget=100.0, privacy={"budget_delta": 1e-12})
    clock = SimulatedTime(10 * DAY + 100.0)
    store = StateStore(tmp_path / "state.sqlite", monotonic=clock.monotonic)
    core = AgentCore(config, store, sources={"imu": ScriptedSource(per_poll=2)},
                     rng=np.random.default_rng(0))
    for _ in range(3):
        core.tick(clock.advance(1))
    assert sum(len(m["codes"]) for m in messages(store)) == 3  # 2 + 1: delta ran out
    assert store.spent_delta("w1", DAY, clock.wall) == 900
    status = core.status()
    assert status["budget"]["delta"] == 1e-12
    assert status["budget"]["delta_spent"] == 900 / DELTA_UNIT
    assert status["channels"]["ax"]["exhausted"] is True
    assert core.local_status()["budget"] == status["budget"]  # the local status too
    # The published status carries it (protocol.BudgetStatus).
    _, decoded = protocol.decode_status(protocol.status_topic("demo", "w1"),
                                        protocol.status(agent="w1", **status))
    assert (decoded.budget.delta, decoded.budget.delta_spent) == (1e-12, 9e-13)


def test_without_a_delta_budget_the_status_shows_no_delta(tmp_path):
    config = make_config(tmp_path, budget=100.0)
    core = AgentCore(config, StateStore(tmp_path / "state.sqlite"),
                     sources={"imu": ScriptedSource(per_poll=2)})
    core.tick(DAY)
    assert set(core.status()["budget"]) == {"epsilon", "spent", "period"}


def test_the_shortest_guarantee_binds_first_and_the_status_shows_each(tmp_path):
    """4 per 10 minutes and 6 per day, 3 readings a second at ε 1: four reports in the
    first ten minutes, two more in the next, then none until the day rolls on."""
    config = parse_config(agent_config(
        state_dir=tmp_path, budget=None, batch_seconds=1.0, channels=[AX_CHANNEL],
        privacy={"guarantees": [{"epsilon": 6, "per": "1d"}, {"epsilon": 4, "per": "10m"}]}))
    clock = SimulatedTime(10 * DAY + 100.0)
    store = StateStore(tmp_path / "state.sqlite", monotonic=clock.monotonic,
                       boot_id=clock.boot_id)
    core = AgentCore(config, store, sources={"imu": ScriptedSource(per_poll=3)},
                     rng=np.random.default_rng(0))
    core.tick(clock.wall)
    core.tick(clock.advance(1))
    assert [len(m["codes"]) for m in messages(store)] == [3, 1]
    core.tick(clock.advance(600))  # the ten minutes rolled on: the day's 2 are left
    core.tick(clock.advance(600))
    assert [len(m["codes"]) for m in messages(store)] == [3, 1, 2]
    status = core.status()
    assert status["guarantees"] == [
        {"epsilon": 4.0, "spent": 2.0, "period": "10m"},
        {"epsilon": 6.0, "spent": 6.0, "period": "1d"}]
    assert status["budget"] == status["guarantees"][-1]
    _, decoded = protocol.decode_status(protocol.status_topic(config.fleet, "w1"),
                                     protocol.status(agent="w1", **status))
    assert [g.period for g in decoded.guarantees] == ["10m", "1d"]


def test_restart_does_not_reset_budget_or_seq(tmp_path):
    config = make_config(tmp_path, budget=4.0)
    store = StateStore(tmp_path / "state.sqlite")
    AgentCore(config, store, sources={"imu": ScriptedSource(per_poll=3)}).tick(DAY + 5)
    store.close()
    store = StateStore(tmp_path / "state.sqlite")
    core = AgentCore(config, store, sources={"imu": ScriptedSource(per_poll=3)})
    core.tick(DAY + 6)
    sent = messages(store)
    assert [(m["seq"], len(m["codes"])) for m in sent] == [(0, 3), (1, 1)]


def test_nan_readings_are_dropped_counted_on_the_device_and_not_charged(tmp_path):
    config = make_config(tmp_path, budget=100.0)
    store = StateStore(tmp_path / "state.sqlite")
    core = AgentCore(config, store, sources={"imu": ScriptedSource(per_poll=10, nan_every=2)})
    core.tick(DAY)
    assert core.local_status()["channels"]["ax"]["non_finite_dropped"] == 5
    assert "non_finite_dropped" not in core.status()["channels"]["ax"]
    assert store.spent("w1", DAY, DAY) == 5 * 10**9
    assert len(messages(store)[0]["codes"]) == 5


def test_out_of_range_readings_are_clipped_and_counted(tmp_path):
    config = make_config(tmp_path, budget=100.0)
    store = StateStore(tmp_path / "state.sqlite")
    core = AgentCore(config, store, sources={"imu": ScriptedSource(per_poll=4, value=7.0)})
    core.tick(DAY)
    assert core.local_status()["channels"]["ax"]["clipped"] == 4


def test_failing_source_is_isolated_and_reported(tmp_path):
    class Broken(ScriptedSource):
        def poll(self, now):
            raise ZeroDivisionError

    config = make_config(tmp_path)
    core = AgentCore(config, StateStore(tmp_path / "state.sqlite"),
                     sources={"imu": Broken()})
    core.tick(DAY)
    assert core.finished
    assert core.failed_sources == {"imu": "ZeroDivisionError while reading"}


def test_service_sends_everything_then_exits_when_sources_end(tmp_path):
    config = make_config(tmp_path, budget=1000.0)
    transport = FakeTransport()
    service = AgentService(config, transport=transport, rng=np.random.default_rng(1),
                           drain_timeout=5)
    service.cores[0].sources = {"imu": ScriptedSource(per_poll=5, polls=3)}
    config_batch = 0.05
    object.__setattr__(config, "batch_seconds", config_batch)
    assert service.run() == 0
    data = [json.loads(p) for t, p, _, _ in transport.published if t.endswith("/ax")]
    assert sum(len(m["codes"]) for m in data) == 15
    assert [m["seq"] for m in data] == list(range(len(data)))
    statuses = [json.loads(p) for t, p, _, r in transport.published if t.endswith("/status")]
    assert statuses[0]["state"] == "online" and statuses[-1]["state"] == "offline"
    assert all(r for t, _, _, r in transport.published if t.endswith("/status"))


def test_service_exit_code_is_1_when_a_source_failed(tmp_path):
    class Failing(ScriptedSource):
        def start(self):
            self.fail("cannot open /dev/i2c-1")

    config = make_config(tmp_path)
    service = AgentService(config, transport=FakeTransport(), drain_timeout=1)
    service.cores[0].sources = {"imu": Failing()}
    assert service.run() == 1


def test_service_loop_sleeps_until_a_batch_or_an_event(tmp_path):
    """The loop wakes for batches, transport events and stops, not on a poll timer:
    the sample configuration's idle CPU was 20 wake-ups a second (BENCHMARKS.md)."""
    config = make_config(tmp_path, budget=1000.0)
    object.__setattr__(config, "batch_seconds", 0.5)
    transport = FakeTransport()
    service = AgentService(config, transport=transport, rng=np.random.default_rng(1),
                           drain_timeout=1)
    service.cores[0].sources = {"imu": ScriptedSource(per_poll=1, polls=10**6)}
    pumps, ticks = [], []
    pump, tick = service.outbox.pump, service.tick
    service.outbox.pump = lambda: (pumps.append(1), pump())[1]
    service.tick = lambda now: (ticks.append(1), tick(now))[1]

    def stop_after_batches():
        while len(ticks) < 6:
            time.sleep(0.01)
        service.request_stop()

    stopper = threading.Thread(target=stop_after_batches)
    stopper.start()
    assert service.run() == 0
    stopper.join()
    # Per batch: the batch's own pump and the one its acknowledgements wake (the old
    # loop: one every 50 ms, 10 per batch here).
    assert len(pumps) <= 3 * len(ticks) + 4, (len(pumps), len(ticks))
    data = [json.loads(p) for t, p, _, _ in transport.published if t.endswith("/ax")]
    assert sum(len(m["codes"]) for m in data) >= 5
    assert service.outbox.acked == service.outbox.sent
