"""Vector channels with a mechanism of whole vectors end to end: real Mosquitto, two
agent processes replaying CSV recordings through a duchi-vector and a sampled-duchi
channel under (epsilon, delta), a real collector process; every axis' estimated mean
holds the truth, and each ledger charged every reading once."""

from __future__ import annotations

import numpy as np

from tests.support import CollectorProcess, replaying_agents, spent_by_channel
from tests.support import wait_for_api as wait_until

AXES = ("ax", "ay", "az")
MEANS = np.array([-1.5, 0.3, 2.0])
CHANNELS = {"joint": {"mechanism": "duchi-vector", "delta": 1e-6},
            "sampled": {"mechanism": "sampled-duchi", "k": 2, "delta": 1e-6}}



def test_every_axis_mean_of_both_mechanisms_holds_the_truth(tmp_path, mosquitto):
    collector = CollectorProcess(tmp_path, mosquitto).start()
    rng = np.random.default_rng(12)
    recordings = [np.clip(MEANS + rng.normal(0.0, 1.0, (5000, 3)) + 0.2 * i, -4.0, 4.0)
                  for i in range(2)]
    agents = replaying_agents(
        tmp_path, mosquitto, [dict(zip(AXES, x.T)) for x in recordings],
        [{"name": name, "source": "rec", "kind": "vector", "fields": list(AXES),
          "epsilon": 2.0, "domain": [-4.0, 4.0], "unit": "g", **settings}
         for name, settings in CHANNELS.items()], privacy={"budget_delta": 0.05})
    for agent in agents:
        assert agent.wait(120) == 0, agent.output()
    truth = np.concatenate(recordings)
    total = truth.shape[0]
    expected = {"joint": 3 * total, "sampled": 2 * total}  # codes: one per reported axis
    assert wait_until(lambda: all(
        collector.api()["channels"].get(name, {}).get("count") == count
        for name, count in expected.items()) and collector.api()["agents_online"] == 0, 60)
    document = collector.api()
    for name, settings in CHANNELS.items():
        channel = document["channels"][name]
        assert channel["kind"] == "vector" and channel["agents"] == 2 and channel["unit"] == "g"
        assert channel["mechanism"]["name"] == settings["mechanism"]
        assert channel["mechanism"]["delta"] == 1e-6
        assert channel["strategy"]["k"] == (3 if name == "joint" else 2)
        for axis, field in enumerate(AXES):
            mean = channel["axes"][field]["mean"]
            true_mean = truth[:, axis].mean()
            # 5 standard errors: a false alarm about 6e-7 per axis
            assert abs(mean["estimate"] - true_mean) <= 5 * mean["stderr"], (name, field, mean)
            assert mean["ci95"][0] - 3 * mean["stderr"] <= true_mean \
                <= mean["ci95"][1] + 3 * mean["stderr"]
    # Each reading was charged once, with its exact delta (at most the configured one).
    for i in range(2):
        spent = spent_by_channel(tmp_path / f"state{i}")
        for name in CHANNELS:
            readings, delta = spent[name]
            assert readings == recordings[i].shape[0]
            assert 0 < delta <= readings * 10**9  # 1e-6 in units of 1e-15
    # /api/channels/<name> has the per-axis windows too.
    detail = collector.api("/api/channels/joint")
    assert sum(w["count"] for w in detail["windows"]) <= detail["count"]
    assert set(detail["windows"][-1]["axes"]) == set(AXES)
