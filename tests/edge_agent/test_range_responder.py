"""The agent's range responder against a real SQLite state store (no network)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from edge_agent import protocol
from edge_agent.mechanisms.randomized_response import RandomizedResponse
from edge_agent.mechanisms.rangefind import answer_epsilon, assigned_round
from edge_agent.range_responder import RangeResponder, RangeWindow
from edge_agent.state import NANO, RANGE_REPLIES, REPORTS, Budget, StateStore, to_nano_up

FLEET = "f"
NOW = 1_800_000_000.0
DAY = 86400.0


def control(run, **fields):
    message = {"v": 1, "run": run, "channel": "ax", "side": "min", "epsilon": 2.0,
               "strategy": "sequential", "window_seconds": 60.0, **fields}
    if message.get("type") == "announce":  # what the coordinator searches; agents ignore it
        message.setdefault("domain", [-10.0, 10.0])
    return protocol.range_control_topic(FLEET, run), json.dumps(message).encode()


def make(tmp_path, agents=3, budget=10.0, range_max=4.0, values=None):
    store = StateStore(tmp_path / "state.sqlite")
    names = [f"w-{i}" for i in range(agents)]
    responder = RangeResponder(fleet=FLEET, agents={n: ["ax"] for n in names}, store=store,
                               budget=Budget.of(budget, DAY), range_epsilon_max=range_max,
                               rng=np.random.default_rng(1))
    for i, name in enumerate(names):
        v = values[i] if values is not None else float(i)
        responder.observe(name, "ax", np.array([NOW - 5, NOW - 1]), np.array([v + 1, v]))
    return store, responder


def spooled(store):
    """Every spooled range reply (they travel in their own lane, ahead of reports)."""
    assert not store.pending(0, 10**6, REPORTS)
    return [(t, json.loads(p)) for _, t, p, _ in store.pending(0, 10**6, RANGE_REPLIES)]


def test_window_extreme_counts_back_from_the_newest_reading():
    window = RangeWindow(keep_seconds=100)
    window.add(np.array([0.0, 1.0]), np.array([5.0, -1.0]))
    window.add(np.array([50.0]), np.array([np.nan]))  # NaN only: ignored
    window.add(np.array([90.0, 91.0]), np.array([2.0, 3.0]))
    assert window.extreme("min", 10) == 2.0 and window.extreme("max", 10) == 3.0
    assert window.extreme("min", 100) == -1.0
    window.add(np.array([150.0]), np.array([7.0]))  # the first block is now older than 100 s
    assert window.extreme("min", 1000) == 2.0
    assert RangeWindow().extreme("min", 10) is None


def test_join_then_answer_each_round_once_and_charge_it(tmp_path):
    store, responder = make(tmp_path)
    responder.handle(*control("r1", type="announce"), NOW)
    joins = [m for t, m in spooled(store) if m["type"] == "join"]
    assert sorted(m["agent"] for m in joins) == ["w-0", "w-1", "w-2"]
    assert all(m["accept"] for m in joins)
    responder.handle(*control("r1", type="announce"), NOW)  # a replayed announce
    assert len(spooled(store)) == 3
    rounds = 4
    for index in range(rounds):
        for _ in range(2):  # every round is delivered twice
            responder.handle(*control("r1", type="round", round=index, rounds=rounds,
                                      threshold=0.5), NOW)
    answers = [m for t, m in spooled(store) if m["type"] == "answer"]
    assert len(answers) == 3 * rounds
    assert {(m["agent"], m["round"]) for m in answers} == {
        (f"w-{i}", r) for i in range(3) for r in range(rounds)}
    assert all(m["z"] in (-1, 1) for m in answers)
    # Each answer is charged its exact loss, rounded up to the ledger's unit.
    answer = RandomizedResponse(epsilon=answer_epsilon(2.0, rounds, "sequential"))
    charge = answer.exact_privacy_loss().ceiling(NANO)
    for agent in ("w-0", "w-1", "w-2"):
        assert store.spent(agent, DAY, NOW) == rounds * charge <= to_nano_up(2.0) + rounds
        assert responder.status(agent)["answered"] == rounds
    # a round past L, or one announcing another L, is never answered
    responder.handle(*control("r1", type="round", round=4, rounds=5, threshold=0.5), NOW)
    responder.handle(*control("r1", type="round", round=0, rounds=2, threshold=0.5), NOW)
    assert len([m for t, m in spooled(store) if m["type"] == "answer"]) == 3 * rounds
    assert responder.status("w-0")["refused"] == {"rounds_changed": 1}


def test_changed_terms_and_unjoined_runs_are_not_answered(tmp_path):
    store, responder = make(tmp_path)
    responder.handle(*control("r2", type="announce"), NOW)
    responder.handle(*control("r2", type="round", round=0, rounds=3, threshold=0.5,
                              epsilon=4.0), NOW)  # epsilon differs from the announce
    responder.handle(*control("r3", type="round", round=0, rounds=3, threshold=0.5), NOW)
    assert not [m for t, m in spooled(store) if m["type"] == "answer"]
    assert responder.status("w-1")["refused"] == {"terms_changed": 1}
    # switching L after a first answer
    responder.handle(*control("r2", type="round", round=0, rounds=3, threshold=0.5), NOW)
    responder.handle(*control("r2", type="round", round=1, rounds=2, threshold=0.5), NOW)
    assert responder.status("w-1")["refused"]["rounds_changed"] == 1
    assert len([m for t, m in spooled(store) if m["type"] == "answer"]) == 3


def test_split_agents_answer_only_their_round_at_full_epsilon(tmp_path):
    store, responder = make(tmp_path, agents=40)
    responder.handle(*control("s1", type="announce", strategy="split"), NOW)
    for index in range(5):
        responder.handle(*control("s1", type="round", strategy="split", round=index, rounds=5,
                                  threshold=10.0), NOW)
    answers = [m for t, m in spooled(store) if m["type"] == "answer"]
    assert len(answers) == 40
    assert all(m["round"] == assigned_round("s1", m["agent"], 5) for m in answers)
    charge = RandomizedResponse(epsilon=2.0).exact_privacy_loss().ceiling(NANO)
    assert charge <= to_nano_up(2.0)
    assert all(store.spent(f"w-{i}", DAY, NOW) == charge for i in range(40))


@pytest.mark.parametrize("kwargs,announce,reason", [
    ({"range_max": 0.0}, {}, "disabled"),
    ({"range_max": 1.0}, {}, "epsilon_above_max"),
    ({"budget": 1.5}, {}, "budget"),
])
def test_refusals_are_sent_and_shown_in_status(tmp_path, kwargs, announce, reason):
    store, responder = make(tmp_path, **kwargs)
    responder.handle(*control("r4", type="announce", **announce), NOW)
    joins = [m for t, m in spooled(store) if m["type"] == "join"]
    assert joins and all(not m["accept"] and m["reason"] == reason for m in joins)
    assert responder.status("w-0")["last_refusal"] == reason
    responder.handle(*control("r4", type="round", round=0, rounds=2, threshold=0.0), NOW)
    assert not [m for t, m in spooled(store) if m["type"] == "answer"]


def test_budget_exhausted_mid_run_stops_answers(tmp_path):
    # 2.0 per run at L = 2 (1.0 each), but only 1.5 left in the period
    store, responder = make(tmp_path, agents=1, budget=2.5)
    responder.handle(*control("r5", type="announce"), NOW)
    with store.transaction(NOW) as tx:  # spend 1.0 of the period on reports first
        assert tx.charge("w-0", "ax", cost=NANO, wanted=1, budget=Budget.of(2.5, DAY)) == 1
    for index in range(2):
        responder.handle(*control("r5", type="round", round=index, rounds=2, threshold=5.0),
                         NOW)
    assert len([m for t, m in spooled(store) if m["type"] == "answer"]) == 1
    assert responder.status("w-0")["refused"] == {"exhausted": 1}
    assert store.spent("w-0", DAY, NOW) <= 2.5e9


def test_answers_are_randomized_response_of_the_window_value(tmp_path):
    """2,000 agents all below the threshold: mean z = 2p - 1 (5 sigma)."""
    n = 2000
    store, responder = make(tmp_path, agents=n, values=np.zeros(n))
    responder.handle(*control("r6", type="announce", strategy="split", epsilon=1.0), NOW)
    responder.handle(*control("r6", type="round", strategy="split", epsilon=1.0, round=0,
                              rounds=1, threshold=0.5), NOW)
    z = np.array([m["z"] for t, m in spooled(store) if m["type"] == "answer"])
    assert z.size == n
    p = math.exp(1) / (1 + math.exp(1))
    assert abs(z.mean() - (2 * p - 1)) < 5 * math.sqrt(4 * p * (1 - p) / n)


@pytest.mark.parametrize("payload", [b"{", b"[]", b'{"v": 1, "type": "round", "run": "a b"}',
                                     b'{"v": 2, "type": "announce", "run": "x"}',
                                     b"x" * 5000])
def test_hostile_control_messages_are_counted_and_ignored(tmp_path, payload):
    store, responder = make(tmp_path)
    responder.handle(protocol.range_control_topic(FLEET, "x"), payload, NOW)
    topic, good = control("other", type="announce")
    responder.handle(protocol.range_control_topic(FLEET, "x"), good, NOW)  # run != topic
    assert responder.invalid == 2 and store.spooled == 0
