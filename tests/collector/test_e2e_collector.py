"""The collector end to end: real Mosquitto, real agents, a real collector process."""

from __future__ import annotations

import json
import math
import sqlite3
import time
import urllib.request

import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM
from tests.support import (
    AgentProcess,
    CollectorProcess,
    MqttClient,
    Subscriber,
    write_agent_config,
)
from tests.support import wait_for_api as wait_until  # every wait here asks the API

ACTIVITIES = ("rest", "run", "walk")  # sorted: searchsorted numbers them
X_BINS = (-2.0, -1.5, -1.0, -0.5, 0.0, 2.0)


def ledger_reports(state_dir) -> dict[str, int]:
    db = sqlite3.connect(f"file:{state_dir}/state.sqlite?mode=ro", uri=True)
    rows = db.execute("SELECT channel, SUM(reports) FROM spending GROUP BY channel").fetchall()
    db.close()
    return dict(rows)


def test_agents_and_collector_estimates_match_the_truth(tmp_path, mosquitto):
    collector = CollectorProcess(tmp_path, mosquitto).start()
    rng = np.random.default_rng(8)
    truths, agents = [], []
    for i in range(3):
        n = 4000
        x = np.clip(rng.normal(-1.2 + 0.3 * i, 0.3, n), -2, 2)  # near the lower edge
        theta = rng.vonmises(1.0, 2.0, n)
        activity = rng.choice(ACTIVITIES, n, p=[0.6, 0.3, 0.1])
        truths.append((x, theta, activity))
        path = tmp_path / f"rec{i}.csv"
        path.write_text("x,theta,activity\n" + "".join(
            f"{a:.6f},{b:.6f},{c}\n" for a, b, c in zip(x, theta, activity)))
        config = write_agent_config(
            tmp_path / f"agent{i}.toml", agent_id=f"w{i}", broker=mosquitto,
            state_dir=tmp_path / f"state{i}", privacy={"budget_delta": 0.01},
            sources=[{"name": "rec", "type": "csv", "path": str(path), "pace": "fast",
                      "columns": {"x": "x", "theta": "theta", "activity": "activity"}}],
            channels=[{"name": "x", "source": "rec", "field": "x", "kind": "linear",
                       "epsilon": 2.0, "domain": [-2.0, 2.0]},
                      {"name": "x_u", "source": "rec", "field": "x", "kind": "linear",
                       "mechanism": "ogpm-unbiased", "epsilon": 2.0, "domain": [-2.0, 2.0]},
                      {"name": "theta", "source": "rec", "field": "theta",
                       "kind": "circular", "epsilon": 2.0, "origin": -math.pi},
                      # words -> GRR (auto); bins of a number -> OLH under (eps, delta)
                      {"name": "activity", "source": "rec", "field": "activity",
                       "kind": "categorical", "categories": list(ACTIVITIES),
                       "epsilon": 2.0},
                      {"name": "x_bins", "source": "rec", "field": "x", "kind": "categorical",
                       "bin_edges": list(X_BINS), "oracle": "olh", "epsilon": 2.0,
                       "delta": 1e-6}])
        agents.append(AgentProcess(config, tmp_path / f"agent{i}.log").start())
    for agent in agents:
        assert agent.wait(120) == 0, agent.output()
    x_all = np.concatenate([t[0] for t in truths])
    theta_all = np.concatenate([t[1] for t in truths])
    # all three said "offline" when they finished (a status comes on its own topic: it
    # may be counted after the last report)
    assert wait_until(lambda: collector.api()["channels"].get("theta", {}).get("count")
                      == x_all.size and collector.api()["agents_online"] == 0, 30)
    document = collector.api()
    assert set(document["agents"]) == {"w0", "w1", "w2"}
    for name in ("x", "x_u"):
        channel = document["channels"][name]
        assert channel["count"] == x_all.size and channel["agents"] == 3
        mean = channel["mean"]
        assert abs(mean["estimate"] - x_all.mean()) <= 5 * mean["stderr"] + mean["bias_bound"]
        assert mean["ci95"][0] - 3 * mean["stderr"] <= x_all.mean() <= mean["ci95"][1] + 3 * mean[
            "stderr"]
    assert abs(document["channels"]["x"]["mean"]["estimate"] - x_all.mean()) < abs(
        document["channels"]["x"]["mean"]["raw"] - x_all.mean())
    x_bins = np.clip(np.searchsorted(X_BINS, x_all, side="right") - 1, 0, len(X_BINS) - 2)
    activity_all = np.concatenate([t[2] for t in truths])
    for name, numbers in (("activity", np.searchsorted(ACTIVITIES, activity_all)),
                          ("x_bins", x_bins)):
        frequencies = document["channels"][name]["frequencies"]
        assert document["channels"][name]["count"] == x_all.size
        true = np.bincount(numbers, minlength=len(frequencies["labels"])) / x_all.size
        # 5 standard errors: a false alarm about 6e-7 per category
        assert np.all(np.abs(np.array(frequencies["estimate"]) - true)
                      <= 5 * np.array(frequencies["stderr"])), (name, frequencies, true)
        assert math.isclose(sum(frequencies["shares"]), 1.0)
    assert document["channels"]["x_bins"]["mechanism"]["delta"] == 1e-6
    theta = document["channels"]["theta"]
    true_direction = np.angle(np.exp(1j * theta_all).mean())
    assert abs(np.angle(np.exp(1j * (theta["circular_mean"] - true_direction)))) < 0.1
    # One channel's detail has its tumbling windows; /metrics agrees with the API.
    detail = collector.api("/api/channels/x")
    assert sum(w["count"] for w in detail["windows"]) <= detail["count"]
    with urllib.request.urlopen(collector.url + "/metrics") as response:
        metrics = response.read().decode()
    counts = {sample.labels["channel"]: sample.value
              for family in text_string_to_metric_families(metrics)
              for sample in family.samples if sample.name == "ldp_channel_count"}
    assert counts["x"] == x_all.size
    shares = {sample.labels["category"]: sample.value
              for family in text_string_to_metric_families(metrics)
              for sample in family.samples if sample.name == "ldp_channel_category_share"
              and sample.labels["channel"] == "activity"}
    assert shares == dict(zip(ACTIVITIES, document["channels"]["activity"]["frequencies"]
                              ["shares"]))
    # Retained snapshots for any MQTT dashboard.
    snapshot = {}
    client = Subscriber(mosquitto, "ldp/v1/demo/_aggregates/#", on_message=lambda m:
                        snapshot.__setitem__(m.topic, json.loads(m.payload)))
    # Snapshots are retained and refreshed every second: the newest has every value.
    assert wait_until(lambda: snapshot.get("ldp/v1/demo/_aggregates/x", {}).get("count")
                      == x_all.size, 10)
    assert wait_until(lambda: snapshot.get("ldp/v1/demo/_aggregates/activity", {}).get(
        "frequencies") == document["channels"]["activity"]["frequencies"], 10)
    client.close()
    assert collector.terminate() == 0


def test_the_api_states_the_guarantees_the_online_agents_state(tmp_path, mosquitto):
    """Two agents promise ε 4 per 10 minutes and 120 per day, one (the shorthand) 500 a
    day: the API lists both promises, the most common first, from their statuses; once
    an agent goes offline its promise is no longer listed."""
    collector = CollectorProcess(tmp_path, mosquitto).start()
    two = {"guarantees": [{"epsilon": 120, "per": "1d"}, {"epsilon": 4, "per": "10m"}]}
    agents = []
    for i, (budget, privacy) in enumerate([(None, two), (None, two), (500.0, {})]):
        config = write_agent_config(tmp_path / f"agent{i}.toml", agent_id=f"w{i}",
                                    broker=mosquitto, state_dir=tmp_path / f"state{i}",
                                    budget=budget, privacy=privacy)
        agents.append(AgentProcess(config, tmp_path / f"agent{i}.log").start())
    try:
        assert wait_until(lambda: collector.api()["agents_online"] == 3)
        stated = collector.api()["guarantees"]
        assert stated == {"others": 0, "promises": [
            {"agents": 2, "guarantees": [{"epsilon": 4.0, "per": "10m"},
                                         {"epsilon": 120.0, "per": "1d"}]},
            {"agents": 1, "guarantees": [{"epsilon": 500.0, "per": "1d"}]}]}
        assert agents[2].terminate() == 0
        assert wait_until(lambda: len(collector.api()["guarantees"]["promises"]) == 1)
    finally:
        for agent in agents:
            agent.kill()
    assert collector.terminate() == 0


def test_replays_and_hostile_messages_are_counted_not_aggregated(tmp_path, mosquitto):
    collector = CollectorProcess(tmp_path, mosquitto).start()
    publisher = MqttClient(mosquitto, v5=False).connect()
    mech = ClassicalOGPM(epsilon=1.0, low=0, high=1)

    def send(topic_agent, seq, codes, **changes):
        agent = topic_agent
        payload = protocol.report(agent=agent, channel="ax", kind="linear", seq=seq,
                                  t=time.time(), dt=1.0, mechanism=mech.describe(), codes=codes)
        if changes:
            message = json.loads(payload)
            message.update(changes)
            payload = json.dumps(message).encode()
        topic = protocol.data_topic("demo", topic_agent, "ax")
        publisher.acked(publisher.publish(topic, payload))

    for seq in range(5):
        send("w1", seq, [100, 200])
    for seq in (2, 3, 4, 0):  # a replay of old messages
        send("w1", seq, [100, 200])
    send("w1", 5, [70000])  # out of the grid
    send("w1", 6, [1, 2], agent="w2")  # spoofed: another agent's name on w1's topic
    send("w1", 7, ["1"])  # wrong type
    publisher.acked(publisher.publish("ldp/v1/demo/w1/ax", b"{not json"))
    # Above the protocol's bound: refused by the collector; far above: by the broker,
    # which sends the collector nothing larger than the maximum packet size it asked for.
    publisher.acked(publisher.publish("ldp/v1/demo/w1/ax",
                                      b"x" * (protocol.MAX_REPORT_BYTES + 1000)))
    publisher.acked(publisher.publish("ldp/v1/demo/w1/ax", b"x" * (8 << 20)))
    assert wait_until(lambda: sum(collector.api()["ingest"]["rejects"].values()) == 5, 15), \
        collector.api()["ingest"]
    document = collector.api()
    assert document["channels"]["ax"]["count"] == 10
    assert document["ingest"]["duplicates"] == 4
    assert document["ingest"]["rejects"] == {"bad_code": 2, "spoofed": 1, "json": 1,
                                             "oversized": 1}
    recent = collector.api("/api/rejects")["recent"]
    assert sorted(entry["reason"] for entry in recent) == ["bad_code", "bad_code", "json",
                                                            "oversized", "spoofed"]
    assert all(entry["topic"] == "ldp/v1/demo/w1/ax" and len(entry["payload"]) <= 256
               for entry in recent)
    publisher.close()
    assert collector.terminate() == 0


def test_collector_killed_repeatedly_loses_and_double_counts_nothing(tmp_path, mosquitto):
    collector = CollectorProcess(tmp_path, mosquitto, checkpoint_seconds=1.5).start()
    agents = []
    for i in range(2):
        config = write_agent_config(
            tmp_path / f"agent{i}.toml", agent_id=f"k{i}", broker=mosquitto,
            state_dir=tmp_path / f"state{i}",
            sources=[{"name": "imu", "type": "synthetic", "rate_hz": 100}],
            channels=[{"name": "ax", "source": "imu", "field": "accel_x", "kind": "linear",
                       "epsilon": 1.0, "domain": [-2.0, 2.0]},
                      {"name": "yaw", "source": "imu", "field": "yaw", "kind": "circular",
                       "epsilon": 1.0}],
            batch_seconds=0.1)
        agents.append(AgentProcess(config, tmp_path / f"agent{i}.log").start())
    rng = np.random.default_rng(4)
    for _ in range(3):
        time.sleep(rng.uniform(1.5, 3.0))
        collector.kill()  # SIGKILL at an arbitrary instant
        time.sleep(rng.uniform(0.2, 1.0))  # the broker queues for the persistent session
        collector.start()
    time.sleep(2)
    for agent in agents:
        assert agent.terminate() == 0, agent.output()
    sent = {"ax": 0, "yaw": 0}
    for i in range(2):
        for channel, count in ledger_reports(tmp_path / f"state{i}").items():
            sent[channel] += count
    assert sent["ax"] > 1000
    assert wait_until(lambda: collector.api()["channels"]["ax"]["count"] == sent["ax"]
                      and collector.api()["channels"]["yaw"]["count"] == sent["yaw"], 30), (
        collector.api()["ingest"], sent)
    document = collector.api()
    assert document["channels"]["ax"]["count"] == sent["ax"]
    assert document["channels"]["yaw"]["count"] == sent["yaw"]
    assert not document["ingest"]["rejects"]
    assert collector.terminate() == 0
