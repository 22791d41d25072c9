"""End to end through a real Mosquitto: a fleet under a two-horizon guarantee.

Every report a real subscriber receives is charged at its batch's end (``t + dt``) with
the exact loss of the mechanism it names, once per reading; summed per device over
every sliding window of either guarantee's length, that never exceeds the guarantee,
whether the planner sets the channels or they ask for far more than it allows.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from edge_agent import protocol
from edge_agent.agent import STATE_FILE
from edge_agent.config import parse_config
from edge_agent.fleet import fleet_service
from edge_agent.mechanisms import from_description
from edge_agent.state import NANO, StateStore, to_nano_down
from tests.support import SimulatedTime, Subscriber, agent_config, wait_until

T0 = 1_800_000_000.0
GUARANTEES = [{"epsilon": 2, "per": "1m"}, {"epsilon": 5, "per": "5m"}]
CHANNELS = [
    {"name": "ax", "source": "imu", "kind": "linear", "field": "accel_x", "domain": [-2, 2]},
    {"name": "roll", "source": "imu", "kind": "circular", "field": "roll"},
    {"name": "hm", "source": "imu", "kind": "polar", "fields": ["accel_h_mag", "accel_h_dir"],
     "radius_max": 2.0},
]
AGENTS = 3
MINUTES = 12


def reports_of(tmp_path, mosquitto, planned: bool) -> tuple[list[dict], object]:
    channels = CHANNELS if planned else [{**c, "epsilon": 0.3} for c in CHANNELS]
    config = parse_config(agent_config(
        state_dir=tmp_path, broker=mosquitto, budget=None, batch_seconds=1.0,
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": 5}], channels=channels,
        privacy={"guarantees": GUARANTEES, "range_epsilon_max": 0}))
    time = SimulatedTime(T0)
    store = StateStore(Path(tmp_path) / STATE_FILE, monotonic=time.monotonic,
                       boot_id=time.boot_id)
    subscriber = Subscriber(mosquitto, f"{protocol.TOPIC_ROOT}/#")
    service = fleet_service(config, count=AGENTS, rng=np.random.default_rng(4),
                            clock=lambda: time.wall, drain_timeout=20, store=store)
    for core in service.cores:
        core.warm_up()
        core.start()
    service.transport.start()
    try:
        assert wait_until(lambda: service.transport.connected, 10)
        for _ in range(MINUTES * 60):
            service.tick(time.advance(1.0))
            service.outbox.pump()
    finally:
        service._shutdown()
    assert wait_until(lambda: any(b'"offline"' in p for _, p, _ in subscriber.messages), 20)
    subscriber.close()
    reports = [json.loads(p) for t, p, _ in subscriber.messages
               if not t.endswith("/status") and p]
    return reports, config


def charge_nano(report: dict) -> int:
    mechanism = from_description(report["mechanism"])
    readings = len(report["codes"][0]) if report["kind"] == "polar" else len(report["codes"])
    return mechanism.exact_privacy_loss().ceiling(NANO) * readings


@pytest.mark.parametrize("planned", [True, False], ids=["planned", "asking-too-much"])
def test_no_device_ever_exceeds_either_guarantee_over_any_sliding_window(tmp_path, mosquitto,
                                                                         planned):
    reports, config = reports_of(tmp_path, mosquitto, planned)
    by_agent: dict[str, list[tuple[float, int]]] = {}
    for report in reports:
        by_agent.setdefault(report["agent"], []).append(
            (report["t"] + report["dt"], charge_nano(report)))
    assert len(by_agent) == AGENTS
    for agent, charges in by_agent.items():
        assert {r["channel"] for r in reports if r["agent"] == agent} == \
            {c["name"] for c in CHANNELS}  # every channel reported
        charges.sort()
        times = np.array([t for t, _ in charges])
        cumulative = np.concatenate([[0], np.cumsum([n for _, n in charges])])
        for guarantee in GUARANTEES:
            window = {"1m": 60.0, "5m": 300.0}[guarantee["per"]]
            start = np.searchsorted(times, times - window, side="right")
            in_window = cumulative[np.arange(times.size) + 1] - cumulative[start]
            assert in_window.max() <= to_nano_down(guarantee["epsilon"]), (agent, guarantee)
        if planned:  # every channel reports on its schedule (a first phase, then spacing)
            for p in config.plan.channels:
                sent = sum(1 for r in reports if r["agent"] == agent and r["channel"] == p.name)
                assert sent >= math.floor(MINUTES * 60 / p.spacing) - 1, p.name
        else:  # the ledger refused most of what was asked, and filled the windows
            assert in_window.max() > to_nano_down(GUARANTEES[-1]["epsilon"]) - 0.3 * NANO * 3
