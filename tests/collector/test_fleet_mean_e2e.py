"""Wearers with guarantees of their own, end to end: two real fleets of agents (the
study's wearers at epsilon 4 a report, stricter ones at epsilon 1, with fewer readings)
through a real Mosquitto to a real collector with a results store.  The channel's mean
of all wearers weighs each stratum by its wearers, not its reports; the history serves it
(series=fleet); a restart keeps it."""

from __future__ import annotations

import json
import time

import numpy as np

from edge_agent import protocol
from tests.support import CollectorProcess, FleetProcess, Subscriber, write_agent_config
from tests.support import wait_for_api as wait_until  # every wait here asks the API
from tests.support.configs import FLEET

# (fleet id, wearers, readings each, centre of the readings, epsilon per report)
GROUPS = [("study", 6, 400, -0.5, 4.0), ("strict", 2, 150, 1.0, 1.0)]


def fleet_config(tmp_path, mosquitto, name: str, wearers: int, readings: int, centre: float,
                 epsilon: float, rng) -> tuple:
    """A fleet's configuration, replaying a CSV of its readings split between its virtual
    agents (agent i: rows i, i + wearers, ...); and each agent's mean reading."""
    values = np.clip(rng.normal(centre, 0.3, wearers * readings), -2.0, 2.0)
    path = tmp_path / f"{name}.csv"
    path.write_text("x\n" + "".join(f"{v:.6f}\n" for v in values))
    config = write_agent_config(
        tmp_path / f"{name}.toml", agent_id=name, broker=mosquitto,
        state_dir=tmp_path / f"state-{name}",
        sources=[{"name": "rec", "type": "csv", "path": str(path), "pace": "fast",
                  "columns": {"x": "x"}}],
        channels=[{"name": "ax", "source": "rec", "field": "x", "kind": "linear",
                   "mechanism": "pm-c", "epsilon": epsilon, "domain": [-2.0, 2.0],
                   "unit": "g"}])
    return config, [float(values[i::wearers].mean()) for i in range(wearers)]


def test_the_mean_of_all_wearers_weighs_each_guarantees_wearers(tmp_path, mosquitto):
    rng = np.random.default_rng(45)
    collector = CollectorProcess(tmp_path, mosquitto,
                                 aggregates={"resolutions": ["1m", "1h"],
                                             "history_seconds": 600},
                                 results={"close_after_seconds": 0}).start()
    try:
        means, fleets = [], []
        for name, wearers, readings, centre, epsilon in GROUPS:
            config, own = fleet_config(tmp_path, mosquitto, name, wearers, readings, centre,
                                       epsilon, rng)
            means += own
            fleets.append(FleetProcess(config, tmp_path / f"{name}.log", wearers).start())
        for fleet in fleets:
            assert fleet.wait(120) == 0, fleet.output()
        total = sum(wearers * readings for _, wearers, readings, _, _ in GROUPS)

        def settled() -> dict | None:
            channel = collector.api("/api/channels/ax")
            fleet_mean = channel.get("fleet_mean")
            if fleet_mean is None or fleet_mean["state"] != "ready":
                return None
            return channel if sum(s["count"] for s in fleet_mean["strata"]) == total else None

        assert wait_until(settled), collector.output()[-2000:]
        channel = settled()
        fleet_mean = channel["fleet_mean"]
        # By wearers (6 and 2), not by reports (2,400 and 300: 8/9 and 1/9).
        assert sorted((s["mechanism"]["epsilon"], s["agents"], s["weight"], s["count"])
                      for s in fleet_mean["strata"]) == [(1.0, 2, 0.25, 300),
                                                         (4.0, 6, 0.75, 2400)]
        truth = float(np.mean(means))  # each wearer's mean, averaged over wearers
        mean = fleet_mean["mean"]
        assert abs(mean["estimate"] - truth) <= 5 * mean["stderr"] + mean["bias_bound"]
        assert mean["share"] == 1.0
        # The history serves the fleet's minutes; together they count every report.
        history = collector.api("/api/channels/ax/history?resolution=1m&series=fleet")
        assert history["series"] == "fleet" and history["points"]
        assert sum(p["count"] for p in history["points"]) == total
        # The channel's snapshot (its shown series' aggregates) goes on being published
        # with both strata there (one made after now).
        since = time.time()
        subscriber = Subscriber(mosquitto, protocol.aggregates_topic(FLEET, "ax"))
        try:
            assert subscriber.wait_for(lambda: any(
                json.loads(p)["t"] > since for _, p, _ in list(subscriber.messages) if p),
                30), collector.output()[-2000:]
        finally:
            subscriber.close()
        # A restart keeps the strata, their wearers and the fleet's mean.
        assert collector.terminate() == 0
        collector.start()
        assert wait_until(settled)
        assert settled()["fleet_mean"] == fleet_mean
    finally:
        collector.terminate()
