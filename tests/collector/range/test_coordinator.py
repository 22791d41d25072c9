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
from collector.range.coordinator import RangeCoordinator, RunRequest, connect_client
from collector.range.results import RangeResults
from edge_agent import protocol
from edge_agent.mechanisms.rangefind import assigned_round, true_answer
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
        # the (truthful) answers find the value, but 8 answers at eps 6.7 cannot rule
        # out a minimum far below: the result says so instead of passing as trustworthy
        assert result["status"] == "insufficient", result
        assert result["reason"] == ("8 agents: the search's error bound \u00b120.5 is wider "
                                    "than the domain [-20, 20]")
        assert abs(result["estimate"] - 1.0) <= 40 / 2 ** 3
        assert result["interval"][0] <= 1.0 <= result["interval"][1]
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
        # the field report: 4 agents, 12 sequential rounds at eps 1 on [-1, 1] (it said
        # min 1.0, max -1.0).  No round could tell 4 answers at eps/12 from noise: the
        # run ends insufficient before any round is asked, so nobody pays.
        agents.values = {f"a{i}": v for i, v in enumerate([-0.7, -0.2, 0.4, 0.95])}
        coord.client.stop()  # the same client id: one connection at a time
        coord = coordinator(mosquitto, epsilon=1.0, rounds=12, min_participants=2,
                            strategy="sequential")
        rounds_before = len(agents.rounds_seen)
        result = coord.run(RunRequest("ax", "min", -1.0, 1.0), expected_agents=4)
        assert result["status"] == "insufficient" and result["participants"] == 4
        assert result["reason"] == (
            "4 agents joined: too few for even one informative round (4 answers at "
            "\u03b5 0.0833 each cannot be told from noise at 95% confidence)")
        assert not {"estimate", "error_bound", "history"} & set(result)
        assert len(agents.rounds_seen) == rounds_before
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
            {"channel": "ax", "sides": ["min", "max"], "every_seconds": 10,
             "domain": [-20.0, 20.0]}]})
    collector.start()
    try:
        assert wait_until(lambda: all(collector.api("/api/range")["channels"].get("ax", {})
                                      .get(side) for side in ("min", "max")), 40)
        served = collector.api("/api/range")["channels"]["ax"]
        result = served["max"]
        assert result["status"] == "done" and result["participants"] == 6
        assert abs(result["estimate"] - 9.0) <= 40 / 2 ** 3
        # the search's own error bound reaches the API: the max of 6 truthful agents is
        # proved above 5 (a round where they said so); above, only the domain bounds it
        assert result["interval"] == [5.0, 20.0] and result["confidence"] == 0.95
        assert result["error_bound"] == max(result["estimate"] - 5.0, 20.0 - result["estimate"])
        assert 2 * result["error_bound"] < 40
        # the min: 6 answers cannot rule out a min far below, so it says why, not a number
        low = served["min"]
        assert low["status"] == "insufficient" and "estimate" in low
        assert low["reason"].startswith("6 agents: the search's error bound \u00b1")
        assert low["reason"].endswith(" is wider than the domain [-20, 20]")
        assert 2 * low["error_bound"] >= 40 and low["interval"][0] <= 4.0 <= low["interval"][1]
        assert collector.api()["range"]["ax"] == served
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


class Retained:
    """What paho hands ``RangeResults.on_message``."""

    def __init__(self, result: dict):
        self.topic = protocol.range_result_topic(FLEET, result["channel"], result["side"])
        self.payload = json.dumps(result).encode()


def published(side, estimate, started_at, **fields):
    return {"v": 1, "run": f"ax-{side}-{int(started_at)}-abcdef", "coordinator": "c",
            "channel": "ax", "side": side, "domain": [-1.0, 1.0], "started_at": started_at,
            "finished_at": started_at + 20, "status": "done", "estimate": estimate, **fields}


def test_a_min_above_the_max_of_the_same_time_is_served_insufficient():
    """The field report: min 1.0 and max -1.0 in the same minute.  The collector serves
    both sides insufficient, saying why; what was published stays visible."""
    results = RangeResults(FLEET, coordinator="c", limit=8)
    results.on_message(None, None, Retained(published("min", 1.0, 1000.0)))
    results.on_message(None, None, Retained(published("max", -1.0, 1025.0)))
    served = results.get()["ax"]
    for side in ("min", "max"):
        assert served[side]["status"] == "insufficient"
        assert served[side]["published_status"] == "done"
        assert served[side]["reason"] == "min 1 exceeds max -1"
    # a new max an hour later is another time: no longer compared
    results.on_message(None, None, Retained(published("max", -1.0, 4600.0)))
    assert {side: r["status"] for side, r in results.get()["ax"].items()} == {
        "min": "done", "max": "done"}
    # an already insufficient side keeps its own reason after the conflict's
    results.on_message(None, None, Retained(published(
        "max", 0.5, 1030.0, status="insufficient", reason="24 agents: too wide")))
    served = results.get()["ax"]
    assert served["max"]["reason"] == "min 1 exceeds max 0.5; 24 agents: too wide"
    results.on_message(None, None, Retained(published("min", -0.5, 1000.0, error_bound=0.25,
                                                      interval=[-0.75, -0.25],
                                                      confidence=0.95)))
    served = results.get()["ax"]  # min -0.5 <= max 0.5: consistent, served as published
    assert served["min"]["status"] == "done" and "published_status" not in served["min"]
    assert served["min"]["error_bound"] == 0.25
    assert list(served["min"]["interval"]) == [-0.75, -0.25]
