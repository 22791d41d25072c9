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
from edge_agent.common.config import parse_period
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


def live(tmp_path, mosquitto, time: SimulatedTime, privacy: dict, channels: list[dict],
         minutes: float):
    """One life of a fleet of AGENTS agents on the state file in ``tmp_path``: ``minutes``
    of one-second batches of simulated time, then a clean stop; returns its config."""
    config = parse_config(agent_config(
        state_dir=tmp_path, broker=mosquitto, budget=None, batch_seconds=1.0,
        sources=[{"name": "imu", "type": "synthetic", "rate_hz": 5}], channels=channels,
        privacy={**privacy, "range_epsilon_max": 0}))
    store = StateStore(Path(tmp_path) / STATE_FILE, monotonic=time.monotonic,
                       boot_id=time.boot_id)
    service = fleet_service(config, count=AGENTS, rng=np.random.default_rng(4),
                            clock=lambda: time.wall, drain_timeout=20, store=store)
    for core in service.cores:
        core.warm_up()
        core.start()
    service.transport.start()
    try:
        assert wait_until(lambda: service.transport.connected, 10)
        for _ in range(int(minutes * 60)):
            service.tick(time.advance(1.0))
            service.outbox.pump()
    finally:
        service._shutdown()
    return config


def received_reports(subscriber: Subscriber, lives: int) -> list[dict]:
    """Every report a subscriber received, once every agent has said it is offline
    ``lives`` times."""
    assert wait_until(lambda: sum(b'"offline"' in p for _, p, _ in subscriber.messages)
                      >= AGENTS * lives, 20)
    subscriber.close()
    return [json.loads(p) for t, p, _ in subscriber.messages if not t.endswith("/status") and p]


def reports_of(tmp_path, mosquitto, planned: bool) -> tuple[list[dict], object]:
    channels = CHANNELS if planned else [{**c, "epsilon": 0.3} for c in CHANNELS]
    subscriber = Subscriber(mosquitto, f"{protocol.TOPIC_ROOT}/#")
    config = live(tmp_path, mosquitto, SimulatedTime(T0), {"guarantees": GUARANTEES},
                  channels, MINUTES)
    return received_reports(subscriber, 1), config


def window_sums(charges: list[tuple[float, int]], window: float) -> np.ndarray:
    """For each of the time-sorted (time, nano) charges, the sum of those in the window of
    ``window`` seconds ending at it."""
    times = np.array([t for t, _ in charges])
    cumulative = np.concatenate([[0], np.cumsum([n for _, n in charges])])
    start = np.searchsorted(times, times - window, side="right")
    return cumulative[np.arange(times.size) + 1] - cumulative[start]


def charges_by_agent(reports: list[dict]) -> dict[str, list[tuple[float, int]]]:
    """Per agent, its reports' (charge time, nano), sorted: charged at the batch's end."""
    by_agent: dict[str, list[tuple[float, int]]] = {}
    for report in reports:
        by_agent.setdefault(report["agent"], []).append(
            (report["t"] + report["dt"], charge_nano(report)))
    return {agent: sorted(charges) for agent, charges in by_agent.items()}


def charge_nano(report: dict) -> int:
    mechanism = from_description(report["mechanism"])
    readings = len(report["codes"][0]) if report["kind"] == "polar" else len(report["codes"])
    return mechanism.exact_privacy_loss().ceiling(NANO) * readings


@pytest.mark.parametrize("planned", [True, False], ids=["planned", "asking-too-much"])
def test_no_device_ever_exceeds_either_guarantee_over_any_sliding_window(tmp_path, mosquitto,
                                                                         planned):
    reports, config = reports_of(tmp_path, mosquitto, planned)
    by_agent = charges_by_agent(reports)
    assert len(by_agent) == AGENTS
    for agent, charges in by_agent.items():
        assert {r["channel"] for r in reports if r["agent"] == agent} == \
            {c["name"] for c in CHANNELS}  # every channel reported
        charges.sort()
        for guarantee in GUARANTEES:
            in_window = window_sums(charges, parse_period(guarantee["per"]))
            assert in_window.max() <= to_nano_down(guarantee["epsilon"]), (agent, guarantee)
        if planned:  # every channel reports on its schedule (a first phase, then spacing)
            for p in config.plan.channels:
                sent = sum(1 for r in reports if r["agent"] == agent and r["channel"] == p.name)
                assert sent >= math.floor(MINUTES * 60 / p.spacing) - 1, p.name
        else:  # the ledger refused most of what was asked, and filled the windows
            assert in_window.max() > to_nano_down(GUARANTEES[-1]["epsilon"]) - 0.3 * NANO * 3


# A study that changes its configuration twice: the shorthand at two minutes with
# channels that ask for their epsilon, then planned guarantees whose ten minutes are
# five times the longest window so far, then the shorthand over twenty minutes.
LIVES = [({"budget_epsilon": 2, "budget_period": "2m"}, 0.3, 4),
         ({"guarantees": [{"epsilon": 2, "per": "1m"}, {"epsilon": 6, "per": "10m"}]}, None, 8),
         ({"budget_epsilon": 8, "budget_period": "20m"}, 0.3, 6)]


def test_a_study_that_changes_its_guarantees_never_exceeds_what_each_states(tmp_path,
                                                                            mosquitto):
    """Shorthand -> guarantees -> shorthand, manual -> planned -> manual, windows
    lengthened from two minutes to ten and twenty, the agent restarted at each change:
    every report a real subscriber receives keeps every window of every guarantee in
    force when it was charged within that guarantee, counted over all earlier lives."""
    time = SimulatedTime(T0)
    subscriber = Subscriber(mosquitto, f"{protocol.TOPIC_ROOT}/#")
    ends = []
    for privacy, epsilon, minutes in LIVES:
        channels = CHANNELS if epsilon is None else [{**c, "epsilon": epsilon}
                                                     for c in CHANNELS]
        config = live(tmp_path, mosquitto, time, privacy, channels, minutes)
        ends.append((time.wall, config.privacy.horizons))
    by_agent = charges_by_agent(received_reports(subscriber, len(LIVES)))
    assert len(by_agent) == AGENTS
    for agent, charges in by_agent.items():
        times = np.array([t for t, _ in charges])
        begun = T0
        for end, guarantees in ends:
            in_life = (times > begun) & (times <= end)
            assert in_life.any(), (agent, end)  # every life reported
            for guarantee in guarantees:
                in_window = window_sums(charges, guarantee.seconds)[in_life]
                assert in_window.max() <= to_nano_down(guarantee.epsilon), (agent, guarantee)
            begun = end
