"""Ingest: validation, rejects, dedup, series separation, and the journal/checkpoint store."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.aggregation import dedup
from collector.aggregation.dedup import SeqTracker
from collector.aggregation.ingest import Ingestor
from collector.storage import checkpoint
from collector.storage.store import CollectorStore
from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM, PolarOGPM, UnbiasedOGPM
from edge_agent.protocol import Rejected
from edge_agent.protocol import decode_report as parse_report
from tests.support.schema import protocol_validator

FLEET = "demo"
LINEAR = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)


def report(agent="w1", channel="ax", seq=0, codes=(1, 2, 3), mechanism=LINEAR, kind="linear",
           **extra) -> tuple[str, bytes]:
    payload = protocol.report(agent=agent, channel=channel, kind=kind, seq=seq, t=1000.0,
                              dt=1.0, mechanism=mechanism.describe(), codes=list(codes), **extra)
    return protocol.data_topic(FLEET, agent, channel), payload


def mutate(payload: bytes, **changes) -> bytes:
    message = json.loads(payload)
    for key, value in changes.items():
        if value is ...:
            message.pop(key)
        else:
            message[key] = value
    return json.dumps(message).encode()


def test_valid_reports_of_every_kind_are_accepted_and_match_the_schema():
    polar = PolarOGPM(epsilon=4.0, radius_max=2.0)
    vector = UnbiasedOGPM(epsilon=0.5, low=-1, high=1)
    messages = [
        report(),
        report(channel="roll", kind="circular", mechanism=CircularOGPM(epsilon=1.0)),
        report(channel="p", kind="polar", mechanism=polar, codes=[[1, 2], [3, 4]]),
        report(channel="v", kind="vector", mechanism=vector, codes=[[1], [], [2, 3]],
               fields=["x", "y", "z"], strategy={"k": 2, "d": 3, "epsilon": 1.0}),
    ]
    ingestor = Ingestor(fleet=FLEET)
    for topic, payload in messages:
        protocol_validator().validate(json.loads(payload))
        assert ingestor.ingest(topic, payload) == "accepted"
    assert ingestor.counters["values"] == 3 + 3 + 2 + 3


def test_a_copy_of_the_aggregates_is_the_restored_state_and_stays_detached():
    """What the documents are computed from (``copy_aggregates``, no decoder) equals what
    a state written and read back gives (the decoder for states from elsewhere)."""
    polar = PolarOGPM(epsilon=4.0, radius_max=2.0)
    ingestor = Ingestor(fleet=FLEET)
    for seq, (topic, payload) in enumerate([
            report(), report(seq=1, codes=(5, 6)),
            report(channel="roll", kind="circular", mechanism=CircularOGPM(epsilon=1.0)),
            report(channel="p", kind="polar", mechanism=polar, codes=[[1, 2], [3, 4]]),
            report(agent="w2", codes=(7,)), (protocol.status_topic(FLEET, "w3"),
                                             protocol.status(agent="w3", state="online"))]):
        ingestor.ingest(topic, payload, 1000.0 + seq)
    ingestor.ingest(*report(agent="w1", channel="bad", codes=(70000,)), 1010.0)  # a reject
    twin = ingestor.copy_aggregates()
    restored = Ingestor.from_state(ingestor.to_state())
    assert twin.series == restored.series and twin.latest == restored.latest
    assert twin.agents == restored.agents and twin.rejects == restored.rejects
    assert list(twin.dead_letters) == list(restored.dead_letters)
    assert twin.status_only == restored.status_only == {"w3"}
    assert twin.to_state() == restored.to_state()
    before = twin.to_state()
    ingestor.ingest(*report(seq=2, codes=(9,)), 1011.0)
    ingestor.ingest(*report(agent="w4"), 1012.0)
    assert twin.to_state() == before and "w4" not in twin.agents


@pytest.mark.parametrize("change,reason", [
    (dict(v=2), "version"),
    (dict(seq=-1), "schema"),
    (dict(seq=1.5), "schema"),
    (dict(t="now"), "schema"),
    (dict(t=float("nan")), "json"),  # NaN is not JSON
    (dict(codes=[1, 2.5]), "bad_code"),
    (dict(codes=[1, True]), "bad_code"),
    (dict(codes=[65536]), "bad_code"),
    (dict(codes=[-1]), "bad_code"),
    (dict(codes="1,2,3"), "schema"),
    (dict(codes=[[1, 2]]), "bad_code"),
    (dict(kind="circular"), "kind"),
    (dict(kind="polar"), "kind"),
    (dict(kind="sideways"), "schema"),
    (dict(mechanism={"name": "gauss", "epsilon": 1}), "mechanism"),
    (dict(mechanism={"name": "ogpm", "epsilon": -1, "low": 0, "high": 1}), "mechanism"),
    (dict(mechanism={"name": "ogpm", "epsilon": 1, "low": 0, "high": 1, "colour": 1}),
     "mechanism"),
    (dict(mechanism="ogpm"), "mechanism"),
    (dict(agent="w2"), "spoofed"),
    (dict(channel="ay"), "spoofed"),
    (dict(agent="_collector"), "schema"),
    (dict(extra=1), "schema"),
    (dict(codes=...), "schema"),
])
def test_bad_reports_are_rejected_counted_and_change_nothing(change, reason):
    ingestor = Ingestor(fleet=FLEET)
    ingestor.ingest(*report(seq=0))
    before = pickle.dumps((ingestor.series, ingestor.trackers))
    topic, payload = report(seq=1)
    assert ingestor.ingest(topic, mutate(payload, **change)) == f"rejected:{reason}"
    assert ingestor.rejects[reason] == 1
    assert pickle.dumps((ingestor.series, ingestor.trackers)) == before
    assert ingestor.dead_letters[-1]["reason"] == reason
    # A later valid message still works.
    assert ingestor.ingest(*report(seq=1)) == "accepted"


@pytest.mark.parametrize("payload,reason", [
    (b"\xff\xfe", "json"), (b"[1, 2]", "json"), (b"{", "json"), (b"[" * 100_000, "json"),
    (b"x" * (2 << 20), "oversized"),
])
def test_hostile_payloads(payload, reason):
    ingestor = Ingestor(fleet=FLEET)
    assert ingestor.ingest(protocol.data_topic(FLEET, "w1", "ax"), payload) == f"rejected:{reason}"


def test_topics_outside_the_protocol_are_ignored_or_rejected():
    ingestor = Ingestor(fleet=FLEET)
    topic, payload = report()
    assert ingestor.ingest("ldp/v1/other/w1/ax", payload) == "ignored"
    assert ingestor.ingest("ldp/v1/demo/_aggregates/ax", payload) == "ignored"
    assert ingestor.ingest("ldp/v1/demo/w1/ax/extra", payload) == "rejected:topic"
    assert ingestor.ingest(protocol.status_topic(FLEET, "w1"),
                           protocol.status(agent="w1", state="online")) == "status"
    assert ingestor.agents["w1"].online is True
    assert ingestor.ingest(protocol.status_topic(FLEET, "w1"), b"{]") == "rejected:status"


def test_duplicates_and_out_of_order_redeliveries():
    ingestor = Ingestor(fleet=FLEET)
    for seq in (0, 1, 3, 1, 2, 3, 0):  # 3 overtakes 2; 1, 3 and 0 come again
        ingestor.ingest(*report(seq=seq))
    assert ingestor.counters["messages"] == 4 and ingestor.counters["duplicates"] == 3
    assert ingestor.counters["values"] == 12
    tracker = ingestor.trackers[("w1", "ax")]
    assert tracker.floor == 3 and tracker.runs == []


def test_seq_tracker_memory_is_bounded_by_its_gaps(monkeypatch):
    monkeypatch.setattr(dedup, "MAX_RUNS", 8)
    tracker = SeqTracker()
    for seq in range(1, 500, 2):  # every other number: a gap before each
        tracker.add(seq)
    assert len(tracker.runs) == 8 and tracker.skipped == 483 and tracker.floor == -1
    assert tracker.seen(0) and tracker.seen(482)  # given up on: late copies dropped here
    assert not tracker.counted(0) and not tracker.counted(481)  # ... but never counted
    assert tracker.counted(485) and not tracker.seen(486)
    tracker.add(486)
    assert tracker.runs[:2] == [(485, 487), (489, 489)]


@pytest.mark.parametrize("big", [2**33, 2**52, protocol.SEQ_LIMIT - 1])
def test_seq_tracker_memory_does_not_depend_on_the_numbers(big):
    """A huge number is one run, not a bitmap up to it (it used to allocate 2**big bits)."""
    tracker = SeqTracker()
    for seq in (0, 1, big, 2, big - 1, 4):
        tracker.add(seq)
    assert tracker.floor == 2 and tracker.runs == [(4, 4), (big - 1, big)]
    assert tracker.seen(big) and not tracker.seen(3) and not tracker.seen(big - 2)
    tracker.add(3)
    assert tracker.floor == 4 and tracker.runs == [(big - 1, big)]
    assert tracker.to_state("a", "c").runs == [(big - 1, big)]


def test_a_jump_never_drops_the_reports_below_it():
    """Issue 12, defect 2: a seq far above the others made the next 16,384 reports of
    the device count as duplicates."""
    tracker = SeqTracker()
    tracker.add(0)
    tracker.add(131_072 + 10)
    assert not any(tracker.seen(seq) for seq in range(1, 20_000))


@pytest.mark.parametrize("seed", range(4))
def test_seq_tracker_matches_a_plain_set(seed):
    """Runs bookkeeping against the obvious model, with gaps, re-sends and runs added
    whole (as a checkpoint restores them), in any order."""
    rng = np.random.default_rng(seed)
    tracker, model = SeqTracker(), set()
    numbers = rng.permutation(3000)[:2000].tolist() + list(range(0, 3000, 7))
    for seq in numbers:
        assert tracker.seen(seq) == (seq in model)
        if rng.random() < 0.1:
            end = seq + int(rng.integers(0, 40))
            tracker.add_run(seq, end)
            model.update(range(seq, end + 1))
        else:
            tracker.add(seq)
            model.add(seq)
        assert len(tracker.runs) <= dedup.MAX_RUNS
    assert all(tracker.seen(s) == (s in model) == tracker.counted(s) for s in range(3100))
    assert tracker.floor == min(set(range(3100)) - model) - 1
    starts = [start for start, _ in tracker.runs]
    assert starts == sorted(starts) and all(
        b[0] > a[1] + 1 for a, b in zip(tracker.runs, tracker.runs[1:]))  # disjoint, apart
    again = SeqTracker.from_state(tracker.to_state("a", "c"))
    assert (again.floor, again.skipped, again.runs) == (tracker.floor, -1, tracker.runs)


def test_agents_cannot_touch_each_others_series_or_seqs():
    ingestor = Ingestor(fleet=FLEET)
    ingestor.ingest(*report(agent="a", seq=0))
    ingestor.ingest(*report(agent="b", seq=0))  # same seq, another agent: not a duplicate
    assert ingestor.counters["messages"] == 2
    # b claiming a's topic is spoofing.
    topic, _ = report(agent="a", seq=1)
    _, payload = report(agent="b", seq=1)
    assert ingestor.ingest(topic, payload) == "rejected:spoofed"


def test_changed_parameters_start_a_new_series():
    ingestor = Ingestor(fleet=FLEET)
    ingestor.ingest(*report(seq=0))
    ingestor.ingest(*report(seq=1, mechanism=ClassicalOGPM(epsilon=2.0, low=-2, high=2)))
    ingestor.ingest(*report(seq=2, mechanism=ClassicalOGPM(epsilon=1.0, low=-3, high=3)))
    assert len(ingestor.series["ax"]) == 3
    assert all(s.count() == 3 for s in ingestor.series["ax"].values())


# -- property-based fuzzing of the parser ---------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5)
    | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=30)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.dictionaries(st.sampled_from(sorted({"v", "agent", "channel", "kind", "seq", "t", "dt",
                                                "mechanism", "codes", "fields", "strategy",
                                                "x"})), json_values, max_size=12))
def test_fuzzed_messages_never_crash_and_agree_with_the_schema(message):
    payload = json.dumps(message).encode()
    topic = protocol.data_topic(FLEET, str(message.get("agent", "w1"))[:20] or "w1",
                                str(message.get("channel", "ax"))[:20] or "ax")
    try:
        parse_report(topic, payload, FLEET)
        accepted = True
    except Rejected:
        accepted = False
    if accepted:  # anything we accept is valid by the published schema
        protocol_validator().validate(json.loads(payload))
    Ingestor(fleet=FLEET).ingest(topic, payload)  # and the ingestor survives it


@settings(max_examples=200, deadline=None)
@given(seq=st.integers(0, 2**40), codes=st.lists(st.integers(0, 65535), max_size=50),
       t=st.floats(0, 2e9), field=st.sampled_from(["seq", "codes", "t", "kind", "agent"]),
       junk=json_values)
def test_fuzzed_fields_of_valid_messages(seq, codes, t, field, junk):
    topic, payload = report(seq=seq, codes=codes)
    message = json.loads(payload)
    assert parse_report(topic, payload, FLEET).seq == seq
    message[field] = junk
    mutated = json.dumps(message).encode()
    try:
        parsed = parse_report(topic, mutated, FLEET)
    except Rejected:
        return
    protocol_validator().validate(json.loads(mutated))
    assert np.all((np.asarray(parsed.codes) >= 0) & (np.asarray(parsed.codes) < 65536))


# -- the store: checkpoint + journal replay gives exactly the committed state -----------------

def test_checkpoint_plus_journal_replay_equals_the_live_state(tmp_path):
    from collector.config import parse_collector_config
    from collector.storage.checkpoint import restore

    config = parse_collector_config({"fleet": FLEET, "storage": {"path": str(tmp_path / "s.db")}})
    store = CollectorStore(config.storage.path)
    live, position = restore(config, store)
    assert position == 0
    rng = np.random.default_rng(0)
    for seq in range(40):
        topic, payload = report(seq=seq, codes=rng.integers(0, 65536, 20).tolist())
        store.append(topic, payload, 1000.0 + seq)
        if seq % 5 == 4:
            store.commit()  # what the network process does
        for row_id, t, p, received in store.read_journal(position)[0]:  # the aggregator
            live.ingest(t, p, received)
            position = row_id
        if seq == 15:
            store.checkpoint(checkpoint.dump(live), position)
    store.commit()
    for _row_id, t, p, received in store.read_journal(position)[0]:
        live.ingest(t, p, received)
    uncommitted = report(seq=40)
    store.append(*uncommitted, 2000.0)  # buffered, never committed: lost with the "crash"
    store._db.close()
    recovered, recovered_position = restore(config, CollectorStore(config.storage.path))
    assert recovered.counters["messages"] == 40
    assert recovered.counters == live.counters
    assert pickle.dumps(recovered.series) == pickle.dumps(live.series)
    # The broker redelivers the unacknowledged message; a redelivered old one is a duplicate.
    assert recovered.ingest(*uncommitted, 2000.0) == "accepted"
    assert recovered.ingest(*report(seq=3), 2000.0) == "duplicate"


def test_confirmations_name_every_settled_number_of_agents_heard_since_the_last():
    ingestor = Ingestor(fleet=FLEET)
    for seq in (0, 1, 2, 5):
        ingestor.ingest(*report(seq=seq))
    ingestor.ingest(*report(agent="w2", seq=0))
    ingestor.ingest(*report(channel="ay", seq=7))
    confirmations = ingestor.confirmations(now=5.0)
    assert sorted(confirmations) == ["w1", "w2"] and not ingestor.unconfirmed
    message = protocol.decode_confirm(protocol.confirm_topic(FLEET, "w1"), confirmations["w1"],
                                      FLEET)
    assert message.channels == {"ax": [(0, 2), (5, 5)], "ay": [(7, 7)]} and message.t == 5.0
    assert ingestor.confirmations(now=6.0) == {}
    ingestor.ingest(*report(seq=1))  # a re-send: its agent lacks our confirmation
    assert list(ingestor.confirmations(now=7.0)) == ["w1"]
    ingestor.ingest(protocol.data_topic(FLEET, "w3", "ax"), b"{")  # refused: no agent
    assert ingestor.confirmations(now=8.0) == {}
