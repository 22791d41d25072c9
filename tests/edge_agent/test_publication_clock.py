"""Reports are published on the batch clock, never when their computation ends: what the
readings make the kernels do (a discrete Gaussian's rejection rounds, II-PTT's second
word, a Duchi vector's axes) is not seen in when a report leaves the device
(docs/guides/PRIVACY.md, "Timing")."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

from edge_agent.agent import AgentService
from edge_agent.config import parse_config
from edge_agent.readings import Readings
from edge_agent.sources.base import Source
from tests.support import FakeTransport, agent_config

# Mechanisms whose work depends on the value, on one field over [-2, 2].
CHANNELS = [{"name": "pm", "source": "imu", "field": "accel_x", "kind": "linear",
             "epsilon": 1.0, "domain": [-2.0, 2.0]},
            {"name": "tent", "source": "imu", "field": "accel_x", "kind": "linear",
             "epsilon": 1.0, "domain": [-2.0, 2.0], "mechanism": "ii-ptt"},
            {"name": "gauss", "source": "imu", "field": "accel_x", "kind": "linear",
             "epsilon": 1.0, "delta": 1e-7, "domain": [-2.0, 2.0], "mechanism": "opt-gm"}]
BATCHES = 12


class Events:
    """One run's order of events: the batch clock's ticks and every report published."""

    def __init__(self):
        self.log: list[tuple[str, object]] = []

    def tick_of(self, published: int) -> int:
        """The batch clock's tick after which the ``published``-th event happened."""
        return sum(kind == "tick" for kind, _ in self.log[:published])


class ConstantSource(Source):
    """``value`` in every reading, three a batch."""

    def __init__(self, value: float):
        super().__init__("imu")
        self.value = value

    def poll(self, now):
        return Readings(now - 1 + np.arange(1, 4) / 3, {"accel_x": np.full(3, self.value)})


class RecordingTransport(FakeTransport):
    def __init__(self, record: Events):
        super().__init__()
        self.record = record

    def publish(self, topic, payload, *, qos=1, retain=False):
        if not topic.endswith("/status"):
            report = json.loads(payload)
            self.record.log.append(("report", (report["channel"], report["seq"])))
        return super().publish(topic, payload, qos=qos, retain=retain)


def publication_ticks(tmp_path, value: float) -> dict[tuple[str, int], int]:
    """Run the agent's own loop for BATCHES batches of readings all equal to ``value``;
    per report (channel, seq): the batch clock tick it was published after."""
    config = parse_config(agent_config(state_dir=tmp_path, batch_seconds=0.05,
                                       channels=CHANNELS, privacy={"budget_delta": 1e-3}))
    events = Events()
    transport = RecordingTransport(events)
    service = AgentService(config, transport=transport, rng=np.random.default_rng(7),
                           drain_timeout=1)
    service.cores[0].sources = {"imu": ConstantSource(value)}
    tick = service.tick

    def ticking(now):
        events.log.append(("tick", None))
        tick(now)
        if sum(kind == "tick" for kind, _ in events.log) >= BATCHES:
            service.request_stop()

    service.tick = ticking
    runner = threading.Thread(target=service.run)
    runner.start()
    runner.join(60)
    assert not runner.is_alive()
    return {what: events.tick_of(k) for k, (kind, what) in enumerate(events.log)
            if kind == "report"}


def test_reports_are_published_on_the_next_tick_of_the_batch_clock_whatever_the_values(
        tmp_path):
    low = publication_ticks(tmp_path / "low", -2.0)
    high = publication_ticks(tmp_path / "high", 2.0)
    # The report of tick k's batch (seq k - 1) goes out after the batch clock's next tick
    # began and before that tick's computation: at the same tick in both runs, readings
    # at opposite ends of the domain.  The stop's own tick (BATCHES + 1) records one more
    # batch, published a batch later without a tick of its own.
    assert low == high
    for (channel, seq), tick in low.items():
        assert tick == min(seq + 2, BATCHES + 1), (channel, seq, tick)
    # Every batch of every channel was published, the stop's last one included.
    assert {channel for channel, _ in low} == {c["name"] for c in CHANNELS}
    assert len(low) == len(CHANNELS) * (BATCHES + 1)


@pytest.mark.parametrize("batch_seconds, published", [(0.05, 1), (1.0, 0)])
def test_the_last_batch_waits_for_its_tick_at_a_stop(tmp_path, batch_seconds, published):
    """A stop records what the sources still hold and publishes it a batch after the stop
    began, not when its computation ends; when the drain's time (three quarters of 1 s)
    ends before that, it stays in the spool for the next start."""
    config = parse_config(agent_config(state_dir=tmp_path, batch_seconds=batch_seconds,
                                       channels=CHANNELS[:1]))
    events = Events()
    service = AgentService(config, transport=RecordingTransport(events),
                           rng=np.random.default_rng(7), drain_timeout=1)
    service.cores[0].sources = {"imu": ConstantSource(0.0)}
    service._shutdown()
    assert len(events.log) == published
    assert len(spooled(tmp_path)) == 1 - published


def spooled(state_dir) -> list:
    from edge_agent.state import StateStore
    store = StateStore(state_dir / "state.sqlite")
    try:
        return store.pending(0, 100)
    finally:
        store.close()
