"""State store (budget, seq, spool), channels and outbox: logic against a real SQLite file."""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from edge_agent import protocol
from edge_agent import transport as transport_module
from edge_agent.channels import Selection, build_channel, vector_plan
from edge_agent.config import DeliveryConfig, VectorChannelConfig, parse_config
from edge_agent.protocol import Rejected
from edge_agent.readings import Readings
from edge_agent.state import (
    DELTA_UNIT,
    NANO,
    RANGE_REPLIES,
    Budget,
    Limit,
    StateStore,
    delta_units_down,
    delta_units_up,
    to_nano_down,
    to_nano_up,
)
from edge_agent.transport import Outbox
from tests.support import FakeTransport, SimulatedTime, agent_config


def _config(**overrides):
    """A budget of 10 and one linear channel ``ax`` unless ``overrides`` say otherwise;
    nothing here writes to the state dir."""
    return parse_config(agent_config(state_dir="/tmp/unused", budget=10.0, batch_seconds=None,
                                     **overrides))


def _message(seq, allowed):
    return "ldp/v1/demo/w1/ax", json.dumps({"seq": seq, "n": allowed}).encode()


@dataclass
class Charge:
    """One channel's wish to release ``wanted`` reports at ``cost`` nano-epsilon (and
    ``delta`` units of delta) each."""

    agent: str
    channel: str
    cost: int
    wanted: int
    build: Callable = _message
    delta: int = 0


@dataclass
class Released:
    allowed: int
    seq: int | None
    exhausted: bool


DAY = 86400.0


def record(store: StateStore, charges: list[Charge], *, now: float,
           budget: Budget) -> list[Released]:
    """Charge, number and spool in one transaction, as the agent core does."""
    results = []
    with store.transaction(now) as tx:
        for c in charges:
            allowed = tx.charge(c.agent, c.channel, cost=c.cost, wanted=c.wanted, budget=budget,
                                delta_cost=c.delta)
            seq = None
            if allowed:
                seq = tx.take_seq(c.agent, c.channel)
                tx.spool(*c.build(seq, allowed))
            results.append(Released(allowed, seq, allowed < c.wanted))
    return results


# -- the ledger ----------------------------------------------------------------------------

def test_budget_allows_only_what_fits_and_persists(tmp_path):
    path, clock = tmp_path / "state.sqlite", SimulatedTime()
    budget = Budget.of(5.0, DAY)
    store = StateStore(path, monotonic=clock.monotonic)
    [r] = record(store, [Charge("w1", "ax", 1_500_000_000, 4)], now=clock.wall, budget=budget)
    assert (r.allowed, r.seq, r.exhausted) == (3, 0, True)  # 3 * 1.5 <= 5 < 4 * 1.5
    assert store.spent("w1", DAY, clock.wall) == 4_500_000_000
    store.close()
    again = StateStore(path, monotonic=clock.monotonic)  # a restart does not reset the budget
    [r] = record(again, [Charge("w1", "ax", NANO // 2, 10)], now=clock.advance(60),
                 budget=budget)
    assert (r.allowed, r.seq) == (1, 1)
    [r] = record(again, [Charge("w1", "ax", NANO // 2, 1)], now=clock.advance(DAY - 3600),
                 budget=budget)
    assert r.allowed == 0 and r.exhausted and r.seq is None  # still within the rolling day
    # A day (and a bucket) after the first charges, they leave the window; the sequence
    # continues.
    [r] = record(again, [Charge("w1", "ax", NANO // 2, 10)],
                 now=clock.advance(3600 - 60 + budget.bucket_seconds), budget=budget)
    assert (r.allowed, r.seq) == (9, 2)  # the first 4.5 are gone, the 0.5 after them is not


def test_budget_is_shared_by_channels_and_never_overspent_by_rounding(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    charges = [Charge("w1", "a", NANO // 10, 40), Charge("w1", "b", NANO // 10, 40)]
    results = record(store, charges, now=1000.0, budget=Budget.of(3.0, DAY))
    assert [r.allowed for r in results] == [30, 0]  # 30 * 0.1 = 3.0 exactly, no more
    assert store.spent("w1", DAY, 1000.0) == 3 * NANO


def test_charges_round_up_and_budgets_down_exactly():
    # The float 0.1 is 0.1000000000000000055...: its exact ceiling is one unit more.
    assert to_nano_up(0.1) == 100_000_001 and to_nano_down(0.1) == 100_000_000
    assert to_nano_up(3.0) == to_nano_down(3.0) == 3 * NANO
    assert to_nano_up(Fraction(384, 25)) == 15_360_000_000


def test_charge_seq_and_message_are_atomic(tmp_path):
    """A failure while building the message leaves no charge, no seq and no message."""
    store = StateStore(tmp_path / "s.sqlite")

    def broken(seq, allowed):
        raise RuntimeError("perturbation failed")

    with pytest.raises(RuntimeError):
        record(store, [Charge("w1", "ax", NANO, 2), Charge("w1", "ay", NANO, 2, broken)],
               now=1000.0, budget=Budget.of(100, DAY))
    assert store.spent("w1", DAY, 1000.0) == 0
    assert store.next_seq("w1", "ax") == 0
    assert store.spooled == 0 and store.pending(0, 10) == []


def test_a_savepoint_undoes_one_part_of_a_transaction(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    budget = Budget.of(100, DAY)
    with store.transaction(1000.0) as tx:
        with tx.savepoint():
            tx.charge("w1", "ax", cost=NANO, wanted=2, budget=budget)
            tx.spool(*_message(tx.take_seq("w1", "ax"), 2))
        with pytest.raises(RuntimeError), tx.savepoint():
            tx.charge("w1", "ay", cost=NANO, wanted=3, budget=budget)
            tx.take_seq("w1", "ay")
            raise RuntimeError("this channel failed")
        assert tx.spent("w1", DAY) == 2 * NANO
    assert store.spent("w1", DAY, 1000.0) == 2 * NANO and store.spooled == 1
    assert store.next_seq("w1", "ax") == 1 and store.next_seq("w1", "ay") == 0


def test_agents_sharing_a_file_have_separate_ledgers_and_seqs(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    record(store, [Charge("a", "ax", NANO, 3), Charge("b", "ax", NANO, 5)], now=1000.0,
           budget=Budget.of(4, DAY))
    assert store.spent("a", DAY, 1000.0) == 3 * NANO and store.spent("b", DAY, 1000.0) == 4 * NANO
    assert store.next_seq("a", "ax") == 1 and store.next_seq("b", "ax") == 1


def test_state_file_is_wal_and_holds_no_raw_readings(tmp_path):
    path = tmp_path / "s.sqlite"
    store = StateStore(path)
    record(store, [Charge("w1", "ax", NANO, 1)], now=1000.0, budget=Budget.of(10, DAY))
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


# -- delta ((epsilon, delta)-LDP reports, basic composition) ----------------------------------

D = 7  # delta units (1e-15) one report costs in these tests


def test_a_delta_budget_allows_what_fits_until_the_window_passes(tmp_path):
    clock = SimulatedTime()
    budget = Budget.of(100.0, DAY, delta=Decimal(3 * D) / DELTA_UNIT)  # exactly 3 reports
    assert budget.limits[0].delta == 3 * D
    store = StateStore(tmp_path / "s.sqlite", monotonic=clock.monotonic)
    [r] = record(store, [Charge("w1", "ax", NANO, 5, delta=D)], now=clock.wall, budget=budget)
    assert (r.allowed, r.exhausted) == (3, True)
    assert store.spent_delta("w1", DAY, clock.wall) == 3 * D
    assert store.spent("w1", DAY, clock.wall) == 3 * NANO  # epsilon is charged alongside
    # Shared by the channels; a report that costs no delta still goes out.
    results = record(store, [Charge("w1", "ay", NANO, 2, delta=D), Charge("w1", "az", NANO, 2)],
                     now=clock.advance(DAY - 3600), budget=budget)
    assert [r.allowed for r in results] == [0, 2]
    # A day (and a bucket) after the first charges, they leave the rolling window.
    [r] = record(store, [Charge("w1", "ax", NANO, 5, delta=D)],
                 now=clock.advance(3600 + budget.bucket_seconds), budget=budget)
    assert r.allowed == 3
    assert store.budget_report("w1", DAY, clock.wall) == {"ax": (3 * NANO, 3, 3 * D),
                                                          "az": (2 * NANO, 2, 0)}


@pytest.mark.parametrize("epsilon,delta,allowed", [
    (2.0, 3 * D, 2),  # epsilon is the tighter
    (10.0, 3 * D, 3),  # delta is the tighter
])
def test_epsilon_and_delta_both_bind_and_the_tighter_wins(tmp_path, epsilon, delta, allowed):
    store = StateStore(tmp_path / "s.sqlite")
    budget = Budget((Limit(to_nano_down(epsilon), DAY, delta),))
    [r] = record(store, [Charge("w1", "ax", NANO, 5, delta=D)], now=1000.0, budget=budget)
    assert r.allowed == allowed
    assert store.spent("w1", DAY, 1000.0) == allowed * NANO
    assert store.spent_delta("w1", DAY, 1000.0) == allowed * D
    [r] = record(store, [Charge("w1", "ax", NANO, 1, delta=D)], now=1001.0, budget=budget)
    assert r.allowed == 0


def test_a_report_that_costs_delta_is_never_allowed_without_a_delta_budget(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    results = record(store, [Charge("w1", "ax", NANO, 5, delta=1), Charge("w1", "ay", NANO, 5)],
                     now=1000.0, budget=Budget.of(100.0, DAY))
    assert [r.allowed for r in results] == [0, 5]
    assert store.spent_delta("w1", DAY, 1000.0) == 0


@pytest.mark.parametrize("delta_cost", [-1, 1.0, True, None])
def test_a_delta_cost_must_be_a_non_negative_integer(tmp_path, delta_cost):
    store = StateStore(tmp_path / "s.sqlite")
    with pytest.raises(ValueError, match="delta_cost"), store.transaction(1000.0) as tx:
        tx.charge("w1", "ax", cost=NANO, wanted=1, budget=Budget.of(1.0, DAY, 1e-6),
                  delta_cost=delta_cost)


def test_delta_spent_survives_restarts_and_clock_steps(tmp_path):
    path, clock = tmp_path / "s.sqlite", SimulatedTime()
    budget = Budget((Limit(100 * NANO, DAY, 3 * D),))

    def charge_once(store):
        [r] = record(store, [Charge("w1", "ax", NANO, 1, delta=D)], now=clock.wall,
                     budget=budget)
        return r.allowed

    store = StateStore(path, monotonic=clock.monotonic, boot_id=clock.boot_id)
    record(store, [Charge("w1", "ax", NANO, 3, delta=D)], now=clock.wall, budget=budget)
    store.close()
    store = StateStore(path, monotonic=clock.monotonic, boot_id=clock.boot_id)  # a restart
    assert store.spent_delta("w1", DAY, clock.wall) == 3 * D
    clock.advance(1.0)
    assert charge_once(store) == 0
    clock.step(-DAY)  # behind: nothing is reported ...
    clock.advance(1.0)
    assert charge_once(store) == 0
    clock.step(+DAY)  # ... and back, or a day ahead: the ledger clock moved by seconds
    clock.advance(1.0)
    assert charge_once(store) == 0
    clock.step(+DAY)
    clock.advance(1.0)
    assert charge_once(store) == 0
    store.close()
    store = StateStore(path, monotonic=clock.monotonic, boot_id=clock.boot_id)
    assert store.spent_delta("w1", DAY, clock.advance(1.0)) == 3 * D
    assert charge_once(store) == 0
    clock.advance(DAY + budget.bucket_seconds)  # a real day and a bucket later: it is back
    assert charge_once(store) == 1


def test_a_savepoint_rolled_back_restores_delta_spending(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    budget = Budget((Limit(100 * NANO, DAY, 3 * D),))
    with store.transaction(1000.0) as tx:
        with tx.savepoint():
            assert tx.charge("w1", "ax", cost=NANO, wanted=2, budget=budget, delta_cost=D) == 2
        with pytest.raises(RuntimeError), tx.savepoint():
            assert tx.charge("w1", "ay", cost=NANO, wanted=1, budget=budget, delta_cost=D) == 1
            assert tx.spent_delta("w1", DAY) == 3 * D
            raise RuntimeError("this channel failed")
        assert tx.spent_delta("w1", DAY) == 2 * D and tx.spent("w1", DAY) == 2 * NANO
        # The undone report's delta is free again in the same transaction.
        assert tx.charge("w1", "az", cost=NANO, wanted=5, budget=budget, delta_cost=D) == 1
    assert store.spent_delta("w1", DAY, 1000.0) == 3 * D
    assert store.budget_report("w1", DAY, 1000.0) == {"ax": (2 * NANO, 2, 2 * D),
                                                      "az": (NANO, 1, D)}


def test_delta_units_round_up_and_budgets_down_exactly():
    third = Fraction(1, 3) / DELTA_UNIT
    assert delta_units_up(third) == 1 and delta_units_down(third) == 0
    assert delta_units_up(Fraction(7, DELTA_UNIT)) == delta_units_down(Fraction(7, DELTA_UNIT)) == 7
    assert delta_units_up(7 * third) == 3 and delta_units_down(7 * third) == 2
    # The float 1e-6 is 9.99999999999999954...e-7: exactly, just under 10**9 units.
    assert delta_units_up(1e-6) == 10**9 and delta_units_down(1e-6) == 10**9 - 1
    assert delta_units_up(Decimal("1e-6")) == delta_units_down(Decimal("1e-6")) == 10**9
    assert delta_units_up(Decimal("1.0000000000000001e-15")) == 2
    assert delta_units_down(Decimal("1.0000000000000001e-15")) == 1
    assert delta_units_up(0) == delta_units_down(0.0) == 0
    assert Budget.of(1.0, DAY, 1e-6).limits[0].delta == 10**9 - 1
    assert Budget.of(1.0, DAY).limits[0].delta == 0


# The ledger as state files from before delta accounting have it.
OLD_LEDGER = """
CREATE TABLE spending (
    agent TEXT NOT NULL,
    channel TEXT NOT NULL,
    until REAL NOT NULL,
    spent_nano INTEGER NOT NULL,
    reports INTEGER NOT NULL,
    PRIMARY KEY (agent, channel, until)
);
CREATE INDEX spending_until ON spending (until);
CREATE TABLE ledger_clock (
    id INTEGER PRIMARY KEY CHECK (id = 0),
    ledger_time REAL NOT NULL,
    wall REAL NOT NULL,
    wall_high REAL NOT NULL,
    retain_seconds REAL NOT NULL,
    boot_id TEXT NOT NULL,
    since_boot REAL NOT NULL
);
INSERT INTO ledger_clock VALUES (0, 1000.0, 1000.0, 1000.0, 86400.0, 'an-earlier-boot', 5.0);
"""


def test_a_state_file_from_before_delta_is_migrated(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.executescript(OLD_LEDGER)
    db.execute("CREATE TABLE spool (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, "
               "payload BLOB NOT NULL, qos INTEGER NOT NULL, created REAL NOT NULL)")
    db.execute("INSERT INTO spending VALUES ('w1', 'ax', ?, ?, 2)", (1000.0 + 60, 2 * NANO))
    db.commit()
    db.close()
    # Inspection (edge-agent budget) reads it as it is: it spent no delta.
    reader = StateStore(path, read_only=True)
    assert reader.budget_report("w1", DAY, 1000.0) == {"ax": (2 * NANO, 2, 0)}
    assert reader.spent_delta("w1", DAY, 1000.0) == 0
    reader.close()
    store = StateStore(path)
    columns = {row[1] for row in store._db.execute("PRAGMA table_info(spending)")}
    assert "spent_delta" in columns
    assert store.spent("w1", DAY, 1000.0) == 2 * NANO  # the epsilon it held is kept
    assert store.spent_delta("w1", DAY, 1000.0) == 0
    budget = Budget((Limit(3 * NANO, DAY, 5 * D),))
    [r] = record(store, [Charge("w1", "ax", NANO, 5, delta=D)], now=1000.0, budget=budget)
    assert r.allowed == 1  # 2 of the 3 epsilon were spent before
    assert store.budget_report("w1", DAY, 1000.0) == {"ax": (3 * NANO, 3, D)}
    store.close()
    assert StateStore(path).spent_delta("w1", DAY, 1000.0) == D  # and opened again


# -- the spool ------------------------------------------------------------------------------

def test_spool_cap_drops_oldest_and_counts(tmp_path):
    store = StateStore(tmp_path / "s.sqlite", max_messages=10)
    for i in range(25):
        store.enqueue("t", f"{i}".encode())
    rows = store.pending(0, 100)
    assert [p for _, _, p, _ in rows] == [f"{i}".encode() for i in range(15, 25)]
    assert store.counter("spool_dropped") == 15
    assert store.spooled == 10
    store.close()
    assert StateStore(tmp_path / "s.sqlite", max_messages=10).counter("spool_dropped") == 15


def test_outbox_sends_in_order_and_deletes_only_acked(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    for i in range(30):
        store.enqueue("t", f"{i}".encode())
    transport = FakeTransport(connected=True, auto_ack=False)
    outbox = Outbox(store, transport, window=8)
    outbox.pump()
    assert [p for _, p, _, _ in transport.published] == [f"{i}".encode() for i in range(8)]
    outbox.pump()
    assert len(transport.published) == 8  # the window is full until acks arrive
    transport.ack_all()
    outbox.pump()
    assert store.spooled == 22 and len(transport.published) == 16
    # Disconnected: nothing new goes out; reconnecting resumes in order.
    transport.set_connected(False)
    outbox.pump()
    assert len(transport.published) == 16
    transport.set_connected(True)
    transport.ack_all()
    for _ in range(5):
        outbox.pump()
        transport.ack_all()
    outbox.pump()
    assert store.spooled == 0 and outbox.idle
    assert [p for _, p, _, _ in transport.published] == [f"{i}".encode() for i in range(30)]


# -- channels ----------------------------------------------------------------------------

def test_select_drops_non_finite_readings_and_subsamples_by_time():
    config = _config(channels=[{"name": "ax", "source": "imu", "field": "accel_x",
                                "kind": "linear", "epsilon": 1.0, "domain": [-2, 2],
                                "report_interval": 1.0}])
    channel = build_channel(config.channels[0], agent_id="w1", fleet="demo")
    times = np.arange(0, 3, 0.1)  # 30 readings at 10 Hz
    values = np.sin(times)
    values[[0, 1, 11]] = [np.nan, np.inf, -np.inf]
    selection = channel.select(Readings(times, {"accel_x": values}))
    assert channel.local["non_finite_dropped"] == 3
    assert np.allclose(selection.times, [0.2, 1.2, 2.2])  # first valid at or after each due
    # The schedule carries across batches.
    later = channel.select(Readings(np.arange(3, 4, 0.1), {"accel_x": np.zeros(10)}))
    assert np.allclose(later.times, [3.2])


def test_message_contains_codes_and_mechanism_but_no_values():
    config = _config()
    channel = build_channel(config.channels[0], agent_id="w1", fleet="demo")
    raw = np.array([0.123456789, -5.0, 1.987654321])
    topic, payload = channel.build_message(
        Selection(np.zeros(3), (raw,)), seq=7, allowed=3, t=100.0, dt=1.0,
        rng=np.random.default_rng(0))
    message = json.loads(payload)
    assert topic == "ldp/v1/demo/w1/ax"
    assert message["seq"] == 7 and message["kind"] == "linear" and len(message["codes"]) == 3
    assert message["mechanism"] == channel.mechanism.describe()
    assert all(0 <= c < 2**16 for c in message["codes"])
    assert channel.local["clipped"] == 1
    for value in raw:
        assert repr(float(value))[:8] not in payload.decode()


@pytest.mark.parametrize("mechanism,epsilon,k", [
    ("ogpm-unbiased", 0.3, 1), ("ogpm-unbiased", 20.0, 1),  # error ~ 1/eps**2: sample
    ("pm", 3.0, 1),
    ("ogpm", 0.3, 3), ("ogpm", 20.0, 1),  # bounded output saturates at small eps
    ("duchi", 1.0, 1), ("duchi", 20.0, 3),  # variance floor at large eps
])
def test_vector_auto_plan_follows_the_error_scaling(mechanism, epsilon, k):
    config = VectorChannelConfig(name="v", source="imu", kind="vector", fields=["a", "b", "c"],
                                 epsilon=epsilon, domain=(-1, 1), strategy="auto",
                                 mechanism=mechanism)
    chosen, per_axis = vector_plan(config)
    assert chosen == k
    assert per_axis == pytest.approx(epsilon / k)


def test_vector_sample_reports_k_axes_per_reading():
    config = _config(channels=[{"name": "acc", "source": "imu",
                                "fields": ["accel_x", "accel_y", "accel_z"], "kind": "vector",
                                "epsilon": 3.0, "domain": [-2, 2], "strategy": "sample",
                                "k": 2}])
    channel = build_channel(config.channels[0], agent_id="w1", fleet="demo")
    n = 3000
    values = tuple(np.zeros(n) for _ in range(3))
    _, payload = channel.build_message(Selection(np.zeros(n), values), seq=0, allowed=n, t=0,
                                       dt=1, rng=np.random.default_rng(1))
    message = json.loads(payload)
    sizes = [len(codes) for codes in message["codes"]]
    assert sum(sizes) == 2 * n  # k axes per reading
    assert all(abs(s - 2 * n / 3) < 5 * math.sqrt(n) for s in sizes)  # uniform choice
    assert message["mechanism"]["epsilon"] == 1.5
    assert message["strategy"] == {"k": 2, "d": 3, "epsilon": 3.0}
    assert message["fields"] == ["accel_x", "accel_y", "accel_z"]


def test_a_ptt_vector_sampling_one_axis_is_optts_algorithm_3():
    """OPTT (Ma, Zhu and Wang, arXiv:2112.04745) Algorithm 3: one axis j of d uniformly, PTT
    at the full ε, the
    curator's tuple d x_j on axis j and 0 elsewhere.  A vector channel with mechanism
    "ptt" and k = 1 reports exactly that (the axis and its code); the d-scaled estimate
    is unbiased, and the collector's per-axis mean of the reports received is too."""
    d, n, epsilon = 3, 60_000, 2.0
    config = _config(channels=[{"name": "acc", "source": "imu",
                                "fields": ["accel_x", "accel_y", "accel_z"], "kind": "vector",
                                "epsilon": epsilon, "domain": [-1, 1], "mechanism": "ptt",
                                "strategy": "sample", "k": 1}])
    channel = build_channel(config.channels[0], agent_id="w1", fleet="demo")
    assert channel.mechanism.epsilon == epsilon and channel.mechanism.name == "ptt"
    x = np.array([0.6, -0.3, 0.1])
    values = tuple(np.full(n, v) for v in x)
    _, payload = channel.build_message(Selection(np.zeros(n), values), seq=0, allowed=n, t=0,
                                       dt=1, rng=np.random.default_rng(7))
    per_axis = [channel.mechanism.from_codes(np.array(codes, dtype=np.int64))
                for codes in json.loads(payload)["codes"]]
    assert sum(len(a) for a in per_axis) == n  # one axis per reading
    for axis, reports in enumerate(per_axis):
        variance = float(channel.mechanism.variance(x[axis]))
        # Algorithm 3's estimate: d times the reports of the axis, over all n tuples.
        scaled = d * reports.sum() / n
        scaled_sd = math.sqrt((d * (variance + x[axis] ** 2) - x[axis] ** 2) / n)
        assert abs(scaled - x[axis]) < 5.3 * scaled_sd
        assert abs(reports.mean() - x[axis]) < 5.3 * math.sqrt(variance / reports.size)


def test_range_replies_overtake_a_backlog_of_reports(tmp_path):
    """A round's answer has a deadline: it must not wait behind thousands of reports."""
    store = StateStore(tmp_path / "s.sqlite")
    for i in range(500):
        store.enqueue("ldp/v1/f/a/x", f"report {i}".encode())
    store.enqueue("ldp/v1/f/a/_range/r1", b"answer", lane=RANGE_REPLIES)
    transport = FakeTransport(auto_ack=False)
    outbox = Outbox(store, transport, window=100)
    outbox.pump()
    assert transport.published[0][:2] == ("ldp/v1/f/a/_range/r1", b"answer")
    assert [p for _, p, _, _ in transport.published[1:]] == [f"report {i}".encode()
                                                             for i in range(99)]
    transport.ack_all()
    while store.spooled:  # the rest still goes out, in order, nothing twice
        outbox.pump()
        transport.ack_all()
    reports = [p for t, p, _, _ in transport.published if t.endswith("/x")]
    assert reports == [f"report {i}".encode() for i in range(500)]


def test_a_state_file_from_before_lanes_is_migrated(tmp_path):
    path = tmp_path / "old.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE spool (id INTEGER PRIMARY KEY AUTOINCREMENT, topic TEXT NOT NULL, "
               "payload BLOB NOT NULL, qos INTEGER NOT NULL, created REAL NOT NULL)")
    db.execute("INSERT INTO spool (topic, payload, qos, created) VALUES ('t', x'01', 1, 0)")
    db.commit()
    db.close()
    store = StateStore(path)
    assert store.spooled == 1 and store.pending(0, 10) == [(1, "t", b"\x01", 1)]
    # ... and it leaves on the broker's acknowledgement, as it names no report.
    store.acknowledge([1], until_confirmed=True)
    assert store.spooled == 0


# -- confirmation by the collector ([delivery] confirm = "collector") -------------------------

def spool_reports(store: StateStore, agent: str, channel: str, seqs) -> None:
    with store.transaction() as tx:
        for seq in seqs:
            tx.spool(protocol.data_topic("f", agent, channel), f"{agent} {seq}".encode(),
                     report=(agent, channel, seq))


def confirmation(agent: str, runs, topic_agent: str | None = None) -> tuple[str, bytes]:
    return protocol.confirm_topic("f", topic_agent or agent), protocol.encode(protocol.Confirm(
        v=1, agent=agent, t=1.0, channels={"x": runs}))


def test_reports_stay_spooled_until_the_collector_confirms_them(tmp_path, monkeypatch):
    monkeypatch.setattr(transport_module, "CONFIRMATIONS_SETTLE_SECONDS", 0.0)
    store = StateStore(tmp_path / "s.sqlite")
    spool_reports(store, "a", "x", range(20))
    store.enqueue("ldp/v1/f/a/_range/r1", b"answer", lane=RANGE_REPLIES)
    transport = FakeTransport()
    outbox = Outbox(store, transport, window=100,
                    delivery=DeliveryConfig(confirm="collector", resend_seconds=60),
                    on_message=lambda topic, payload: outbox.confirmed(topic, payload, "f",
                                                                       {"a"}))
    outbox.pump()
    outbox.pump()
    assert len(transport.published) == 21 and outbox.idle
    assert store.spooled == 20 and store.unconfirmed() == 20  # the range reply has left
    transport.deliver(*confirmation("a", [(0, 9), (12, 12)]))
    transport.deliver(*confirmation("b", [(0, 19)]))  # not ours
    transport.deliver(*confirmation("a", [(0, 19)], topic_agent="b"))  # another's topic
    outbox.pump()
    assert store.spooled == 9 and outbox.confirmed_reports == 11
    # A reconnect: what the broker acknowledged before may be lost; sent again, in order.
    transport.set_connected(False)
    transport.set_connected(True)
    outbox.pump()
    outbox.pump()
    again = [payload for _, payload, _, _ in transport.published[21:]]
    assert again == [f"a {seq}".encode() for seq in (10, 11, *range(13, 20))]
    transport.deliver(*confirmation("a", [(0, 19)]))
    outbox.pump()
    assert store.spooled == 0


def test_overdue_confirmations_are_sent_again_with_doubling_waits(tmp_path):
    store = StateStore(tmp_path / "s.sqlite")
    spool_reports(store, "a", "x", range(5))
    rows = [row_id for row_id, *_ in store.pending(0, 10)]
    store.acknowledge(rows, until_confirmed=True, now=1000.0)
    assert store.pending(0, 10) == [] and store.unconfirmed() == 5
    assert store.requeue(resend_seconds=10, now=1009.9) == 0
    assert store.requeue(resend_seconds=10, now=1010.0) == 5
    assert [row[0] for row in store.pending(0, 10)] == rows
    store.acknowledge(rows, until_confirmed=True, now=2000.0)
    assert store.requeue(resend_seconds=10, now=2019.9) == 0  # resent once: twice the wait
    assert store.requeue(resend_seconds=10, now=2020.0) == 5
    store.acknowledge(rows, until_confirmed=True, now=3000.0)
    for _ in range(10):  # the wait stops doubling at 64 times
        store.requeue(resend_seconds=10, now=1e9)
        store.acknowledge(rows, until_confirmed=True, now=3000.0)
    assert store.requeue(resend_seconds=10, now=3639.9) == 0
    assert store.requeue(resend_seconds=10, now=3640.0) == 5
    store.confirm("a", {"x": [(0, 4)]})
    assert store.spooled == 0


def test_confirmations_of_the_wire_are_checked():
    topic, payload = confirmation("a", [(0, 9)])
    assert protocol.decode_confirm(topic, payload, "f").channels == {"x": [(0, 9)]}
    for bad_topic, bad_payload, reason in [
            ("ldp/v1/g/_confirm/a", payload, "topic"),
            (protocol.confirm_topic("f", "b"), payload, "topic"),
            (topic, payload.replace(b"[[0,9]]", b"[[0,9007199254740992]]"), "schema"),
            (topic, b"{", "json"),
            (topic, b" " * (8 << 20), "oversized")]:
        with pytest.raises(Rejected) as caught:
            protocol.decode_confirm(bad_topic, bad_payload, "f")
        assert caught.value.reason == reason
