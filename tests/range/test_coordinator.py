"""The coordinator against a real Mosquitto with scripted agents (raw paho clients).

Scripted agents let a test misbehave on purpose: answer twice, answer a
stale round, answer without joining, answer on another agent's topic,
leave mid-run, or not show up at all.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from collector.config import parse_collector_config
from collector.range import RangeCoordinator, RunRequest, connect_client
from edge_agent import protocol
from edge_agent.rangefind import assigned_round, true_answer
from tests.support import CollectorProcess, Subscriber, free_port, run_module

FLEET = "demo"


class ScriptedAgents:
    """Many agents on one connection; ``behaviour(agent, message)`` -> replies to send."""

    def __init__(self, broker, values: dict[str, float], *, misbehave=None):
        self.values = values
        self.misbehave = misbehave or (lambda agent, message: None)
        self.rounds_seen: list[dict] = []
        self.client = Subscriber(broker, protocol.range_control_subscription(FLEET),
                                 on_message=self._on_message)

    def send(self, agent, run, message, *, as_agent=None):
        topic = protocol.range_reply_topic(FLEET, as_agent or agent, run)
        self.client.publish(topic, json.dumps({"v": 1, "agent": agent, "run": run,
                                               **message}).encode())

    def _on_message(self, msg):
        message = json.loads(msg.payload)
        run = message["run"]
        if message["type"] == "round":
            self.rounds_seen.append(message)
        for agent, value in self.values.items():
            override = self.misbehave(agent, message)
            if override == "silent":
                continue
            if message["type"] == "announce":
                self.send(agent, run, {"type": "join", "accept": True})
            elif message["type"] == "round":
                if message["strategy"] == "split" and \
                        assigned_round(run, agent, message["rounds"]) != message["round"]:
                    continue
                z = true_answer(value, message["threshold"], message["side"])  # no noise:
                # huge epsilon below, so the search must find the value
                self.send(agent, run, {"type": "answer", "round": message["round"], "z": z})

    def close(self):
        self.client.close()


def coordinator(mosquitto, **settings):
    config = parse_collector_config({
        "fleet": FLEET, "broker": {"host": mosquitto.host, "port": mosquitto.port},
        "range_discovery": {"epsilon": 20.0, "join_timeout_seconds": 1.5,
                            "round_timeout_seconds": 1.5, "min_participants": 5,
                            "rounds": 12, **settings}})
    client = connect_client(config, "coordinator-test")
    return RangeCoordinator(client, fleet=FLEET, settings=config.range_discovery)


def result_listener(mosquitto):
    results = []
    client = Subscriber(mosquitto, protocol.range_result_subscription(FLEET),
                        on_message=lambda m: results.append(json.loads(m.payload)))
    return client, results


@pytest.mark.parametrize("strategy", ["sequential", "split"])
def test_honest_agents_are_found_and_the_result_is_retained(mosquitto, strategy):
    rng = np.random.default_rng(3)
    values = {f"a{i}": float(v) for i, v in enumerate(rng.uniform(2.0, 6.0, 60))}
    agents = ScriptedAgents(mosquitto, values)
    # scripted agents answer truthfully; the coordinator debiases for randomized
    # response at eps/L, which is ~exact only when eps/L is large: 20/3 here
    coord = coordinator(mosquitto, strategy=strategy, rounds=4 if strategy == "split" else 3,
                        h=1e-6)
    listener, results = result_listener(mosquitto)
    try:
        result = coord.run(RunRequest("ax", "min", -20.0, 20.0), expected_agents=60)
        assert result["status"] == "done" and result["participants"] == 60
        # answers at eps >= 6.7 flip with probability <= 0.13%: the search is exact
        truth = min(values.values())
        assert abs(result["estimate"] - truth) <= 40 / 2 ** result["rounds"]
        assert result["history"][0]["threshold"] == 0.0
        assert all(r["answers"] == (60 if strategy == "sequential" else r["answers"])
                   for r in result["history"])
        if strategy == "split":
            assert sum(r["answers"] for r in result["history"]) == 60
        time.sleep(0.5)
        assert results and results[-1]["estimate"] == result["estimate"]
        assert results[-1]["finished_at"] >= results[-1]["started_at"]
    finally:
        agents.close()
        listener.close()


def test_stale_duplicate_spoofed_and_uninvited_replies_are_ignored(mosquitto):
    values = {f"a{i}": 1.0 + i for i in range(8)}

    def misbehave(agent, message):
        if message["type"] != "round":
            return None
        run, index = message["run"], message["round"]
        if agent == "a0":  # answers twice, the second time the opposite
            agents.send(agent, run, {"type": "answer", "round": index, "z": -1})
        if agent == "a1" and index > 0:  # a late answer to the previous round
            agents.send(agent, run, {"type": "answer", "round": index - 1, "z": 1})
        if agent == "a2":  # pretends to be a3
            agents.send("a3", run, {"type": "answer", "round": index, "z": -1}, as_agent="a2")
        if agent == "a4":  # never joined
            agents.send("intruder", run, {"type": "answer", "round": index, "z": -1})
            agents.send("a4", run, {"type": "answer", "round": index, "z": 7})
        return None

    agents = ScriptedAgents(mosquitto, values, misbehave=misbehave)
    coord = coordinator(mosquitto, h=1e-6, rounds=3, strategy="sequential")
    try:
        result = coord.run(RunRequest("ax", "min", -20.0, 20.0), expected_agents=8)
        assert result["status"] == "done"
        assert abs(result["estimate"] - 1.0) <= 40 / 2 ** 3
        ignored = result["ignored_replies"]
        assert ignored["duplicate"] >= 3 and ignored["stale"] >= 2
        assert ignored["spoofed"] >= 3 and ignored["not_expected"] >= 3
        assert all(r["answers"] == 8 for r in result["history"])
    finally:
        agents.close()


def test_agents_leaving_mid_run_and_too_few_participants(mosquitto):
    values = {f"a{i}": 3.0 for i in range(10)}
    leaving = {f"a{i}" for i in range(4)}

    def misbehave(agent, message):
        if agent in leaving and message["type"] == "round" and message["round"] >= 2:
            return "silent"
        return None

    agents = ScriptedAgents(mosquitto, values, misbehave=misbehave)
    try:
        # 6 still answer: enough for min_participants 5, the run finishes at the deadlines
        coord = coordinator(mosquitto, h=1e-6, rounds=5, strategy="sequential")
        started = time.monotonic()
        result = coord.run(RunRequest("ax", "max", -20.0, 20.0))
        assert result["status"] == "done", result
        assert [r["answers"] for r in result["history"]] == [10, 10, 6, 6, 6]
        assert abs(result["estimate"] - 3.0) <= 40 / 2 ** 5
        assert time.monotonic() - started >= 1.5 * 3  # waited for the missing ones
        # with min_participants 8, round 2 has too few answers: insufficient, no guess
        coord = coordinator(mosquitto, h=1e-6, rounds=5, min_participants=8,
                            strategy="sequential")
        result = coord.run(RunRequest("ax", "max", -20.0, 20.0), expected_agents=10)
        assert result["status"] == "insufficient" and "round 2" in result["reason"]
        assert "estimate" not in result
        # nobody joins: insufficient
        leaving.update(values)
        agents.misbehave = lambda agent, message: "silent"
        result = coord.run(RunRequest("ax", "max", -20.0, 20.0))
        assert result["status"] == "insufficient" and result["participants"] == 0
    finally:
        agents.close()


def test_the_collector_runs_its_schedule_and_serves_the_result(tmp_path, mosquitto):
    """A collector process with a schedule: the result appears at /api/range."""
    from tests.support import wait_for_api as wait_until

    values = {f"a{i}": 4.0 + i for i in range(6)}
    agents = ScriptedAgents(mosquitto, values)
    collector = CollectorProcess(tmp_path, mosquitto, range_discovery={
        "coordinator": True, "epsilon": 20.0, "strategy": "sequential", "rounds": 3,
        "h": 1e-6, "min_participants": 5, "join_timeout_seconds": 1,
        "round_timeout_seconds": 1, "schedule": [
            {"channel": "ax", "sides": ["max"], "every_seconds": 10, "domain": [-20.0, 20.0]}]})
    collector.start()
    try:
        assert wait_until(lambda: collector.api("/api/range")["channels"].get("ax", {})
                          .get("max"), 40)
        result = collector.api("/api/range")["channels"]["ax"]["max"]
        assert result["status"] == "done" and result["participants"] == 6
        assert abs(result["estimate"] - 9.0) <= 40 / 2 ** 3
        assert collector.api()["range"]["ax"]["min"] is None
    finally:
        agents.close()
        assert collector.terminate() == 0


def test_discover_range_cli_explains_what_is_missing(tmp_path, mosquitto):
    config = tmp_path / "c.toml"
    config.write_text(f'fleet = "demo"\n[broker]\nhost = "127.0.0.1"\nport = {mosquitto.port}\n'
                      f'[http]\nport = {free_port()}\n')
    run = lambda *args: run_module(  # noqa: E731
        "collector", "discover-range", "--config", config, *args, timeout=60)
    missing = run("--channel", "ax", "--side", "min")
    assert missing.returncode == 2 and "no --domain given" in missing.stderr
    bad = run("--channel", "ax", "--side", "median", "--domain", "0", "1")
    assert bad.returncode == 2 and "'median' is not one of 'min', 'max'" in bad.stderr
    nobody = run("--channel", "ax", "--side", "min", "--domain", "0", "1")
    assert nobody.returncode == 3 and "insufficient" in nobody.stdout
    config.write_text(config.read_text().replace(str(mosquitto.port), str(free_port())))
    unreachable = run("--channel", "ax", "--side", "min", "--domain", "0", "1")
    assert unreachable.returncode == 1 and "cannot reach the broker" in unreachable.stderr
