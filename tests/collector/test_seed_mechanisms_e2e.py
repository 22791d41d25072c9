"""Mechanisms linear and vector channels gained from the papers, end to end: real
Mosquitto, agent processes replaying a CSV through the channel, a collector process; the
collector's mean of the fleet (of each axis) is the true mean within its interval.

One case per channel table (``CASES``): a mechanism added to the registry adds a case
here with the keys its channel needs.
"""

from __future__ import annotations

import numpy as np
import pytest

from edge_agent.channels import build_channel
from edge_agent.config import load_config
from edge_agent.mechanisms import from_description
from tests.support import CollectorProcess, replaying_agents, spent_by_channel
from tests.support import wait_for_api as wait_until  # every wait here asks the API

DOMAIN = (-2.0, 2.0)
AGENTS, READINGS = 2, 5000

# The channel's keys beyond name, source and domain (kind "linear" unless given); the
# readings are two fields, x near the lower end of the domain and y near the upper,
# where a biased mechanism's raw mean would be far off.
CASES = {
    "ii-ptt": {"field": "x", "mechanism": "ii-ptt", "epsilon": 2.0},
    # A coarse grid, where the tent's randomized centre matters most: a centre rounded to
    # a tick would be off by up to 0.34% of the width (0.014 here, against a standard
    # error of 0.026; tests/edge_agent/mechanisms/test_tent.py checks the mean exactly).
    "ii-ptt-8-bits": {"field": "x", "mechanism": "ii-ptt", "epsilon": 2.0, "grid_bits": 8},
    # A vector channel takes the same names: each axis at epsilon / 2.
    "ii-ptt-vector": {"kind": "vector", "fields": ["x", "y"], "mechanism": "ii-ptt",
                      "epsilon": 4.0, "strategy": "split"},
    # (epsilon, delta): each report also charges its exact delta, which the agents'
    # [privacy] budget_delta allows (10,000 x 1e-6).
    "opt-gm": {"field": "x", "mechanism": "opt-gm", "epsilon": 2.0, "delta": 1e-6},
}



@pytest.mark.parametrize("case", sorted(CASES))
def test_the_collectors_mean_holds_the_true_mean(tmp_path, mosquitto, case):
    channel = {"name": "ch", "source": "rec", "kind": "linear", "domain": list(DOMAIN),
               **CASES[case]}
    collector = CollectorProcess(tmp_path, mosquitto).start()
    rng = np.random.default_rng([31, sorted(CASES).index(case)])
    recordings = [{"x": np.clip(rng.normal(-1.3 + 0.2 * i, 0.3, READINGS), *DOMAIN),
                   "y": np.clip(rng.normal(1.5 - 0.2 * i, 0.3, READINGS), *DOMAIN)}
                  for i in range(AGENTS)]
    agents = replaying_agents(tmp_path, mosquitto, recordings, [channel],
                              privacy={"budget_delta": 0.05} if "delta" in channel else None)
    for agent in agents:
        assert agent.wait(120) == 0, agent.output()
    fields = channel.get("fields", [channel.get("field")])
    truth = {name: np.concatenate([r[name] for r in recordings]) for name in fields}
    readings = AGENTS * READINGS

    def counted():
        document = collector.api()["channels"].get("ch", {})
        axes = document.get("axes", {}) if channel["kind"] == "vector" else {"x": document}
        return len(axes) == len(fields) and all(
            axes[name].get("count") == readings for name in fields)

    assert wait_until(counted, 30), collector.output()
    document = collector.api()["channels"]["ch"]
    assert document["agents"] == AGENTS
    mechanism = from_description(document["mechanism"])
    assert mechanism.name == channel["mechanism"]
    assert mechanism.grid_bits == channel.get("grid_bits", 16)
    axes = document["axes"] if channel["kind"] == "vector" else {"x": document}
    for name in fields:
        mean, values = axes[name]["mean"], truth[name]
        # 5 standard errors: a false alarm about 6e-7.
        assert abs(mean["estimate"] - values.mean()) <= 5 * mean["stderr"] + mean["bias_bound"], \
            (name, mean)
        assert mean["ci95"][0] - 3 * mean["stderr"] <= values.mean() \
            <= mean["ci95"][1] + 3 * mean["stderr"], (name, mean)
        if mechanism.unbiased:  # the raw average too, within the reports' own error
            spread = np.sqrt(np.mean(mechanism.variance(values)) / values.size)
            assert abs(mean["raw"] - values.mean()) <= 5 * spread, (name, mean, spread)
        histogram = axes[name]["histogram"]
        assert histogram["estimate"] is not None and np.isclose(sum(histogram["estimate"]), 1)
        assert axes[name]["quantiles"] is not None
    # Every reading charged once, with the mechanism's exact delta (0 when pure).
    built = build_channel(load_config(tmp_path / "agent0.toml").channels[0], agent_id="w0",
                          fleet="demo")
    for i in range(AGENTS):
        assert spent_by_channel(tmp_path / f"state{i}")["ch"] == (
            READINGS, READINGS * built.charge_delta)
