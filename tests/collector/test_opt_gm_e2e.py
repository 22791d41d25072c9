"""Opt-GM end to end: real agents report a linear channel with ``mechanism = "opt-gm"``
through a real Mosquitto to a real collector, whose mean lies within its interval of the
truth, and every report's exact δ is in the agents' ledgers."""

from __future__ import annotations

import sqlite3

import numpy as np

from edge_agent.mechanisms import OptimalGaussian
from edge_agent.state import delta_units_up
from tests.support import AgentProcess, CollectorProcess, write_agent_config
from tests.support import wait_for_api as wait_until

READINGS = 6000


def ledger_spent(state_dir) -> tuple[int, int]:
    """(reports, delta units) the ledger charged for the channel."""
    db = sqlite3.connect(f"file:{state_dir}/state.sqlite?mode=ro", uri=True)
    row = db.execute("SELECT SUM(reports), SUM(spent_delta) FROM spending "
                     "WHERE channel = 'hr'").fetchone()
    db.close()
    return row


def test_opt_gm_reports_are_estimated_within_their_interval_and_charged_their_delta(
        tmp_path, mosquitto):
    collector = CollectorProcess(tmp_path, mosquitto).start()
    rng = np.random.default_rng(30)
    truths, agents = [], []
    for i in range(2):
        x = np.clip(rng.normal(70 + 15 * i, 12, READINGS), 40, 200)  # heart rates
        truths.append(x)
        path = tmp_path / f"rec{i}.csv"
        path.write_text("hr\n" + "".join(f"{v:.3f}\n" for v in x))
        config = write_agent_config(
            tmp_path / f"agent{i}.toml", agent_id=f"w{i}", broker=mosquitto,
            state_dir=tmp_path / f"state{i}", privacy={"budget_delta": 0.05},
            sources=[{"name": "rec", "type": "csv", "path": str(path), "pace": "fast",
                      "columns": {"hr": "hr"}}],
            channels=[{"name": "hr", "source": "rec", "field": "hr", "kind": "linear",
                       "mechanism": "opt-gm", "epsilon": 2.0, "delta": 1e-6,
                       "domain": [40.0, 200.0]}])
        agents.append(AgentProcess(config, tmp_path / f"agent{i}.log").start())
    try:
        for agent in agents:
            assert agent.wait(120) == 0, agent.output()
        truth = np.concatenate(truths)
        assert wait_until(lambda: collector.api()["channels"].get("hr", {}).get("count")
                          == truth.size, 60)
        channel = collector.api()["channels"]["hr"]
        assert channel["mechanism"]["name"] == "opt-gm"
        assert channel["mechanism"]["delta"] == 1e-6
        mean = channel["mean"]
        # 5 standard errors: a false alarm about 6e-7.
        assert abs(mean["estimate"] - truth.mean()) <= 5 * mean["stderr"] + mean["bias_bound"]
        assert mean["ci95"][0] - 3 * mean["stderr"] <= truth.mean() <= \
            mean["ci95"][1] + 3 * mean["stderr"]
        mechanism = OptimalGaussian(epsilon=2.0, delta=1e-6, low=40.0, high=200.0)
        # The interval is as wide as the mechanism's noise says: σ / sqrt(n), within 10%.
        assert abs(mean["stderr"] / (mechanism.sigma / np.sqrt(truth.size)) - 1) < 0.1
        charge = delta_units_up(mechanism.exact_delta())
        for i in range(2):
            reports, spent = ledger_spent(tmp_path / f"state{i}")
            assert reports == READINGS and spent == READINGS * charge
    finally:
        for agent in agents:
            agent.kill()
        collector.kill()
