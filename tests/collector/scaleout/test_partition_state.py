"""Partition states: round trips, the JSON document, hostile payloads, the merge view."""

from __future__ import annotations

import asyncio
import copy
import json
import math
import pickle
import types

import msgspec
import numpy as np
import pytest
from nats.js.errors import ObjectNotFoundError

import collector.scaleout.member as member_module
from collector.aggregation.ingest import Ingestor
from collector.aggregation.series import Series
from collector.aggregation.stats import StateError
from collector.api.documents import Views
from collector.api.metrics import document_metrics
from collector.scaleout.member import Member, Partition
from collector.scaleout.merge import MergeView
from collector.scaleout.partition_state import PartitionStateRejected, decode_partition
from collector.scaleout.state_objects import StateObjectMissing, StateObjects
from collector.storage.checkpoint import tracker_states
from collector.storage.states import (
    MAX_PARTITIONS,
    PARTITION_STATE_VERSION,
    AggregateSettings,
    decode_partition_state,
    decode_state_object,
    encode_partition_state,
    encode_state_object,
)
from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM, PolarOGPM, UnbiasedOGPM
from edge_agent.mechanisms.categorical import GeneralizedRR
from tests.collector.aggregation.test_stats import STATISTICS, _make_series, _message, _series_cases

FLEET = "demo"
SETTINGS = {"bins": 20, "window_seconds": 10.0, "keep_windows": 4}
TYPED_SETTINGS = AggregateSettings(**SETTINGS)
PARTITIONS = 8


def as_json(state):
    """A typed state as the plain JSON values it travels as."""
    return json.loads(protocol.encode(state))


def _exactly(a, b) -> bool:
    """Equal to the last bit (floats too), as loaded from JSON text."""
    return json.dumps(msgspec.to_builtins(a)) == json.dumps(msgspec.to_builtins(b))


@pytest.mark.parametrize("name", STATISTICS)
def test_statistic_round_trip_is_exact(name):
    make, draw = STATISTICS[name]
    stat = make()
    stat.update(draw(np.random.default_rng(5), 700))
    text = json.dumps(stat.to_state())  # through JSON text, as on the wire
    again = type(stat).from_state(stat.params(), json.loads(text))
    assert again == stat
    assert _exactly(again.to_state(), stat.to_state())
    empty = make()
    assert type(empty).from_state(empty.params(), empty.to_state()) == empty


@pytest.mark.parametrize("name", STATISTICS)
def test_statistic_refuses_bad_sums(name):
    make, draw = STATISTICS[name]
    stat = make()
    stat.update(draw(np.random.default_rng(6), 50))
    state = stat.to_state()
    if isinstance(state, dict):  # per agent: [reports, counts]
        bad = [None, "1", [], {name: [reports + 1, counts] for name, (reports, counts)
                                in state.items()},
               {name: [reports, [*counts, 0]] for name, (reports, counts) in state.items()},
               {name: [-1, counts] for name, (reports, counts) in state.items()}]
    else:
        bad = [None, "1", [], state + [0], [True] * len(state), [-1] * len(state)]
    for value in bad:
        with pytest.raises(StateError):
            type(stat).from_state(stat.params(), value)


def test_no_bins_the_merge_view_takes_in_overflow_when_every_partition_is_summed():
    """A state's bin is bounded so that the merge view's int64 sum over the most
    partitions a stream can have never overflows (a hostile pair of states once could
    make every merged document fail); one more than the bound is refused."""
    bins = STATISTICS["bins-clip"][0]()
    largest = (2**63 - 1) // MAX_PARTITIONS
    full = type(bins).from_state(bins.params(), [[largest] + [0] * 49, 0])
    merged = type(bins).from_state(bins.params(), [[0] * 50, 0])
    for _ in range(MAX_PARTITIONS):
        merged.merge(full)
    assert int(merged.get()[0]) == MAX_PARTITIONS * largest
    with pytest.raises(StateError, match="expected finite sums"):
        type(bins).from_state(bins.params(), [[largest + 1] + [0] * 49, 0])


def test_statistic_refuses_impossible_sums():
    make, _ = STATISTICS["moments"]
    moments = make()
    with pytest.raises(StateError, match="inconsistent"):
        type(moments).from_state(moments.params(), [2, 10, 5])  # sum > sum of squares
    trig = STATISTICS["trig"][0]()
    with pytest.raises(StateError, match="resultant"):
        type(trig).from_state(trig.params(), [1, 3.0, 0.0])
    bins = STATISTICS["bins-clip"][0]()
    with pytest.raises(StateError, match="outside"):
        type(bins).from_state(bins.params(), [[0] * 50, 3])  # clip has no outside values
    with pytest.raises(StateError, match="list of 50"):
        type(bins).from_state(bins.params(), [[0] * 49, 0])
    with pytest.raises(StateError):
        type(bins).from_state(bins.params(), [[2**63] + [0] * 49, 0])
    with pytest.raises(StateError, match="finite"):
        type(trig).from_state(trig.params(), [1, float("nan"), 0.0])


@pytest.mark.parametrize("name", list(_series_cases()))
def test_series_round_trip(name):
    spec, case = _series_cases()[name]
    rng = np.random.default_rng(3)
    series = _make_series(spec)
    for i in range(12):
        series.update(agent=f"agent-{i % 3}", t=7.0 * i,
                      codes=_message(case, spec["mechanism"], rng, 40))
    state = as_json(series.to_state())
    again = Series.from_state(state, bins=50, window_seconds=10, keep_windows=5)
    assert again == series
    assert _exactly(again.get(windows=True), series.get(windows=True))
    assert _exactly(again.to_state(), series.to_state())


def _categorical_state():
    series = _make_series(_series_cases()["categorical-grr"][0])
    for i in range(4):
        series.update(agent="w1", t=3.0 * i, codes=np.array([0, 1, 4, 4, 2]))
    return as_json(series.to_state())


def _series_state():
    series = _make_series(_series_cases()["linear-ogpm"][0])
    rng = np.random.default_rng(1)
    for i in range(4):
        series.update(agent="w1", t=3.0 * i, codes=rng.integers(0, 1 << 16, 30))
    return as_json(series.to_state())


@pytest.mark.parametrize("mutate, match", [
    (lambda s: s.update(mechanism=CircularOGPM(epsilon=1).describe()),
     "linear channel with mechanism ogpm-circular"),
    (lambda s: s.update(kind="spiral"), "kind"),
    (lambda s: s.update(channel="_x"), "channel"),
    (lambda s: s["mechanism"].update(epsilon=-1), "mechanism"),
    (lambda s: s.update(mechanism="ogpm"), "mechanism"),
    (lambda s: s.update(fields=["a", "b"]), "vector"),
    (lambda s: s.update(agents=["ok", "../x"]), "agents"),
    (lambda s: s.update(messages=-1), "messages"),
    (lambda s: s["total"]["value"]["count"].__setitem__(0, 999), "counts"),
    (lambda s: s["total"]["value"]["raw"][0].__setitem__(0, 10**6), "counts"),
    (lambda s: s["total"].pop("value"), r"missing required field `value` - at `\$\.total`"),
    (lambda s: s["windows"].append(s["windows"][0]), "windows"),
    (lambda s: s["windows"].extend([[100 + i, s["windows"][0][1]] for i in range(5)]),
     "at most 5"),
    (lambda s: s["windows"][0].__setitem__(0, 1.5), r"windows\[0\]\[0\]"),
    (lambda s: s.update(extra=1), "unknown field `extra`"),
])
def test_series_refuses_malformed_states(mutate, match):
    _refused(_series_state(), mutate, match)


@pytest.mark.parametrize("mutate, match", [
    (lambda s: s["total"]["value"]["support"][0].__setitem__(0, 99), "more reports than"),
    (lambda s: s["total"]["value"]["support"][0].__setitem__(1, 0), "add up to the reports"),
    (lambda s: s["total"]["value"]["support"][0].pop(), "expected 5 counts"),
    (lambda s: s["total"]["value"]["count"].__setitem__(0, 21), "counts 20 values"),
    (lambda s: s["mechanism"].update(labels=["a", "b"]), "mechanism"),
    (lambda s: s.update(mechanism=ClassicalOGPM(epsilon=1, low=0, high=1).describe()),
     "categorical channel with mechanism"),
])
def test_categorical_series_refuses_malformed_states(mutate, match):
    _refused(_categorical_state(), mutate, match)


def _refused(state, mutate, match):
    Series.from_state(copy.deepcopy(state), bins=50, window_seconds=10, keep_windows=5)
    mutate(state)
    with pytest.raises(StateError, match=match):
        Series.from_state(state, bins=50, window_seconds=10, keep_windows=5)


# -- whole ingestors --------------------------------------------------------------------------

def fill(ingestor: Ingestor, rng, agents=range(4), seqs=range(6)) -> Ingestor:
    linear = ClassicalOGPM(epsilon=1.0, low=-2, high=2)
    polar = PolarOGPM(epsilon=5.0, radius_max=2.0)
    vector = UnbiasedOGPM(epsilon=0.5, low=-1, high=1)
    grr = GeneralizedRR(epsilon=1.0, categories=3, labels=("rest", "walk", "run"))
    for a in agents:
        agent = f"w{a}"
        ingestor.ingest(protocol.status_topic(FLEET, agent),
                        protocol.status(agent=agent, state="online", t=5.0), 5.0)
        for seq in seqs:
            t = 100.0 + 7 * seq
            messages = {
                "x": dict(kind="linear", mechanism=linear.describe(),
                          codes=rng.integers(0, linear.n_cells, 25).tolist()),
                "yaw": dict(kind="circular", mechanism=CircularOGPM(epsilon=1).describe(),
                            codes=rng.integers(0, 1 << 16, 25).tolist()),
                "p": dict(kind="polar", mechanism=polar.describe(),
                          codes=[rng.integers(0, 1 << 16, 9).tolist(),
                                 rng.integers(0, 1 << 16, 9).tolist()]),
                "acc": dict(kind="vector", mechanism=vector.describe(), fields=["u", "v"],
                            strategy={"k": 1, "d": 2, "epsilon": 0.5},
                            codes=[rng.integers(0, vector.n_cells, 5).tolist(),
                                   rng.integers(0, vector.n_cells, 4).tolist()]),
                "activity": dict(kind="categorical", mechanism=grr.describe(),
                                 # its own generator: the other channels' draws as before
                                 codes=np.random.default_rng([a, seq]).integers(0, 3, 8)
                                 .tolist()),
            }
            for channel, message in messages.items():
                ingestor.ingest(protocol.data_topic(FLEET, agent, channel),
                                protocol.report(agent=agent, channel=channel, seq=seq, t=t,
                                                dt=1.0, **message), t)
        ingestor.ingest(protocol.data_topic(FLEET, agent, "x"), b"{broken", 200.0)
    return ingestor


def new(**settings) -> Ingestor:
    return Ingestor(fleet=FLEET, **{**SETTINGS, "bins": SETTINGS["bins"], **settings})


def test_ingestor_round_trip_gives_the_same_api_document():
    rng = np.random.default_rng(2)
    ingestor = fill(new(), rng)
    ingestor.ingest(protocol.data_topic(FLEET, "w1", "x"),  # a second series of x
                    protocol.report(agent="w1", channel="x", kind="linear", seq=50, t=300.0,
                                    dt=1, mechanism=ClassicalOGPM(epsilon=2, low=-2,
                                                                  high=2).describe(),
                                    codes=[5, 6]), 300.0)
    again = Ingestor.from_state(as_json(ingestor.to_state()))
    clock = lambda: 1000.0  # noqa: E731
    assert _exactly(Views(lambda: again, clock=clock).channels_json(),
                    Views(lambda: ingestor, clock=clock).channels_json())
    assert list(again.dead_letters) == list(ingestor.dead_letters)
    assert again.latest == ingestor.latest and again.latest_at == ingestor.latest_at


def test_merged_states_equal_one_ingestor_that_saw_everything():
    whole = fill(new(), np.random.default_rng(4))
    parts = [new(), new()]
    rng = np.random.default_rng(4)
    # the same messages, agents w0 and w2 to one part, w1 and w3 to the other
    fill(parts[0], rng, agents=[0])
    fill(parts[1], rng, agents=[1])
    fill(parts[0], rng, agents=[2])
    fill(parts[1], rng, agents=[3])
    merged = new()
    for part in parts:
        merged.merge(Ingestor.from_state(as_json(part.to_state())))
    clock = lambda: 1000.0  # noqa: E731
    a = Views(lambda: merged, clock=clock).channels_json()
    b = Views(lambda: whole, clock=clock).channels_json()
    assert a["ingest"] == b["ingest"] and a["agents"] == b["agents"]
    for name in ("x", "p", "acc"):  # integer sums: equal to the last bit
        assert _exactly(a["channels"][name], b["channels"][name])
    yaw_a, yaw_b = a["channels"]["yaw"], b["channels"]["yaw"]  # float sums: rounding order
    assert yaw_a["histogram"] == yaw_b["histogram"] and yaw_a["count"] == yaw_b["count"]
    assert math.isclose(yaw_a["circular_mean"], yaw_b["circular_mean"], rel_tol=1e-12)


def encode_state(ingestor: Ingestor, *, partition: int, now: float, owner: str = "m1",
                 sequence: int = 42) -> bytes:
    """The partition state a member writes (aggregates and trackers)."""
    return encode_partition_state(ingestor.to_state(), tracker_states(ingestor),
                                  partition=partition, partitions=PARTITIONS, owner=owner,
                                  now=now, every=5.0, sequence=sequence)


def _document(ingestor=None, **changes) -> dict:
    ingestor = ingestor or fill(new(), np.random.default_rng(9), agents=[0, 1], seqs=range(3))
    document = json.loads(encode_state(ingestor, partition=1, now=50.0))
    document.update(changes)
    return document


def _payload(document) -> bytes:
    return json.dumps(document).encode()


def _decode(payload: bytes):
    return decode_partition(payload, partition=1, fleet=FLEET, settings=TYPED_SETTINGS)


def test_state_document_decodes():
    document, ingestor = _decode(_payload(_document()))
    assert {key: getattr(document, key) for key in ("v", "type", "t", "every", "owner",
                                                      "sequence")} == \
        {"v": PARTITION_STATE_VERSION, "type": "partition-state", "t": 50.0,
         "every": 5.0, "owner": "m1", "sequence": 42}
    assert ingestor.counters["messages"] == 2 * 3 * 5  # agents x messages x channels


def _set(path, value):
    def mutate(document):
        target = document
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return mutate


def _wrapping_bins(counts: list) -> None:
    """Four bins of 2**62 more: an int64 sum wraps around to the true total."""
    counts[4] += sum(counts[:4])
    counts[:4] = [2**62] * 4


HOSTILE = {
    "not json": (lambda d: None, b"\x80{", "json"),
    "nan": (lambda d: None, b'{"v": NaN}', "json"),
    # Read through the types, an integer beyond any number is a bad version, and an
    # array nested 100,000 deep is an array where an object belongs.
    "huge integer": (lambda d: None, b'{"v": 1' + b"0" * 5000 + b"}", "version"),
    "deep nesting": (lambda d: None, b"[" * 100_000 + b"]" * 100_000, "schema"),
    "not an object": (lambda d: None, b"[1, 2]", "schema"),
    "another version": (_set(["v"], PARTITION_STATE_VERSION + 1), None, "version"),
    "another type": (_set(["type"], "collector-checkpoint"), None, "version"),
    "other partition's number": (_set(["partition"], 2), None, "topic"),
    "other fleet": (_set(["state", "fleet"], "prod"), None, "fleet"),
    "other bins": (_set(["state", "settings", "bins"], 50), None, "settings"),
    "negative t": (_set(["t"], -1), None, "schema"),
    "counters off": (_set(["state", "agents", "w0", "values"], 1), None, "schema"),
    "agent's messages off": (_set(["state", "agents", "w0", "messages"], 999), None, "schema"),
    "bool count": (_set(["state", "agents", "w0", "messages"], True), None, "schema"),
    "a bin count changed": (
        lambda d: d["state"]["series"][0]["total"]["value"]["raw"][0].__setitem__(3, 10**6),
        None, "schema"),
    "latest out of range": (_set(["state", "latest", "x"], [99, None]), None, "schema"),
    "latest of another channel": (_set(["state", "latest", "x"], [1, None]), None, "schema"),
    "series twice": (lambda d: d["state"]["series"].append(d["state"]["series"][0]),
                     None, "schema"),
    "mechanism junk": (_set(["state", "series", 0, "mechanism"], {"name": "x" * 10**5}),
                       None, "schema"),
    "dead letter junk": (_set(["state", "dead_letters"], [{"t": 1}]), None, "schema"),
    "status not an object": (_set(["state", "agents", "w0", "status"], 3), None, "schema"),
    # Consistent with themselves, but no reports could give them; served, they would
    # break every /api/channels call (float overflow) or wrap int64 bin sums.
    "sums beyond the grid": (
        lambda d: d["state"]["series"][0]["total"]["value"].__setitem__(
            "moments", [d["state"]["series"][0]["total"]["value"]["moments"][0],
                        10**400, 10**800]), None, "schema"),
    "bins that wrap int64": (lambda d: _wrapping_bins(
        d["state"]["series"][0]["total"]["value"]["raw"][0]), None, "schema"),
    "reject reason with a newline": (_set(["state", "rejects"], {"schema\n": 1}), None,
                                     "schema"),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_states_are_rejected_with_a_reason(case):
    mutate, raw, reason = HOSTILE[case]
    if raw is None:
        document = _document()
        mutate(document)
        raw = _payload(document)
    with pytest.raises(Exception) as caught:
        _decode(raw)
    assert type(caught.value).__name__ == "PartitionStateRejected"
    assert caught.value.reason == reason, caught.value.detail


def test_merge_view_keeps_the_last_good_state_and_counts_rejects():
    clock = [1000.0]
    view = MergeView(FLEET, TYPED_SETTINGS, clock=lambda: clock[0])
    good = _document()
    assert view.update_partition("p.1", _payload(good)) == "accepted"
    before = Views(view.ingestor, clock=lambda: clock[0]).channels_json()
    for case, (mutate, raw, reason) in HOSTILE.items():
        if raw is None:
            document = copy.deepcopy(good)
            mutate(document)
            raw = _payload(document)
        assert view.update_partition("p.1", raw) == f"rejected:{reason}", case
    # The state of another partition under this key: refused too.
    assert view.update_partition("p.2", _payload(good)) == "rejected:topic"
    for key in ("q.1", "p.x", "p.", "p.12345", "p"):  # not a partition's key
        assert view.update_partition(key, _payload(good)) == "ignored", key
    after = Views(view.ingestor, clock=lambda: clock[0]).channels_json()
    assert after == before  # nothing changed the aggregates
    partitions = view.partitions_json()
    assert sum(partitions["partition_rejects"].values()) == len(HOSTILE) + 1
    assert partitions["partitions"]["p0001"]["messages"] == sum(
        agent["messages"] for agent in good["state"]["agents"].values())
    assert partitions["partitions"]["p0001"]["owner"] == "m1"
    assert partitions["partitions"]["p0001"]["error"].startswith("schema")
    assert partitions["partitions"]["p0002"] == {
        "owner": None, "t": None, "age": None, "received": None, "stale": True, "messages": 0,
        "values": 0, "duplicates": 0, "bytes": 0,
        "error": partitions["partitions"]["p0002"]["error"]}
    # A new good state replaces it and clears the error (the bucket's revision order
    # decides what is newer, not the writer's clock); an empty value (the key emptied)
    # removes the partition.
    assert view.update_partition("p.1", _payload(dict(good, t=40.0, owner="m2"))) == "accepted"
    assert view.partitions_json()["partitions"]["p0001"]["error"] is None
    assert view.partitions_json()["partitions"]["p0001"]["owner"] == "m2"
    assert view.update_partition("p.1", b"") == "removed"
    assert view.ingestor().counters["messages"] == 0


def test_merge_view_merges_partitions_and_reports_freshness():
    clock = [1000.0]
    view = MergeView(FLEET, TYPED_SETTINGS, clock=lambda: clock[0])
    rng = np.random.default_rng(12)
    parts = [fill(new(), rng, agents=[a]) for a in range(3)]
    for i, part in enumerate(parts):
        payload = encode_state(part, partition=i, now=990.0 + i, owner=f"m{i % 2}")
        assert view.update_partition(f"p.{i}", payload) == "accepted"
    merged = view.ingestor()
    assert merged.counters["messages"] == sum(p.counters["messages"] for p in parts)
    assert view.ingestor() is merged  # cached until a state changes
    clock[0] = 1100.0
    partitions = view.partitions_json()["partitions"]
    assert list(partitions) == ["p0000", "p0001", "p0002"]
    assert [p["owner"] for p in partitions.values()] == ["m0", "m1", "m0"]
    assert partitions["p0002"]["age"] == pytest.approx(108.0) and partitions["p0002"]["stale"]
    document = Views(view.ingestor, extra=view.partitions_json).channels_json()
    assert set(document["partitions"]) == {"p0000", "p0001", "p0002"}
    assert document["partition_rejects"] == {}
    ages = {tuple(sample.labels.values()): sample.value
            for family in document_metrics(document) for sample in family.samples
            if sample.name == "ldp_partition_state_age_seconds"}
    assert ages[("p0000",)] == pytest.approx(110.0)


def test_merge_takes_the_series_reported_most_recently_whatever_the_order():
    def one(epsilon, received):
        ingestor = new()
        ingestor.ingest(protocol.data_topic(FLEET, "w1", "x"),
                        protocol.report(agent="w1", channel="x", kind="linear", seq=received,
                                        t=100.0, dt=1, codes=[1, 2],
                                        mechanism=ClassicalOGPM(epsilon=epsilon, low=0,
                                                                high=1).describe()), received)
        return ingestor

    for order in ([one(1.0, 10), one(2.0, 20)], [one(2.0, 20), one(1.0, 10)]):
        merged = new()
        for part in order:
            merged.merge(part)
        document = Views(lambda: merged).channels_json()["channels"]["x"]
        assert document["mechanism"]["epsilon"] == 2.0
        assert [s["mechanism"]["epsilon"] for s in document["other_series"]] == [1.0]


def test_merge_keeps_the_newest_status_whatever_the_order():
    """One state says an agent is online; another heard it go offline since.  The
    newest status must win, not the state merged last."""
    def one(state, t):
        ingestor = new()
        topic = f"{protocol.TOPIC_ROOT}/{FLEET}/w1/status"
        ingestor.ingest(topic, protocol.status(agent="w1", state=state, t=t), t)
        return ingestor

    for order in ([one("online", 10.0), one("offline", 20.0)],
                  [one("offline", 20.0), one("online", 10.0)]):
        merged = new()
        for part in order:
            merged.merge(part)
        assert merged.agents["w1"].online is False and merged.agents["w1"].status.t == 20.0


def test_a_dead_letter_time_beyond_floats_is_rejected():
    document = _document()
    document["state"]["dead_letters"] = [{"t": 123456789.5, "topic": "a", "reason": "b",
                                          "detail": "c", "payload": "d"}]
    raw = _payload(document).replace(b"123456789.5", b"1e400")  # parses as inf
    with pytest.raises(Exception) as caught:
        _decode(raw)
    assert caught.value.reason == "schema" and "dead_letters" in caught.value.detail


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_batched_ingest_equals_message_by_message(batch_size):
    """Ingestor.batch() joins messages' codes per series and window before the
    statistics see them: integer statistics equal message-by-message ingest to the
    last bit, float sums (circular, the polar cross) up to rounding order."""
    class Recorder(Ingestor):
        """Collects what fill() ingests, to replay it in batches."""
        def __init__(self):
            super().__init__(fleet=FLEET, **SETTINGS)
            self.messages = []

        def ingest(self, topic, payload, now=None):
            self.messages.append((topic, payload, now))
            return super().ingest(topic, payload, now)

    one_by_one = fill(Recorder(), np.random.default_rng(21), agents=range(5), seqs=range(9))
    batched = new()
    messages = one_by_one.messages + one_by_one.messages[:40]  # and duplicates
    for first in range(0, len(messages), batch_size):
        with batched.batch():
            for message in messages[first:first + batch_size]:
                batched.ingest(*message)
    for message in one_by_one.messages[:40]:
        one_by_one.ingest(*message)
    clock = lambda: 1000.0  # noqa: E731
    a = Views(lambda: batched, clock=clock).channels_json()
    b = Views(lambda: one_by_one, clock=clock).channels_json()
    assert a["ingest"] == b["ingest"] and a["agents"] == b["agents"]
    assert a["ingest"]["duplicates"] == 39  # the first 40 messages: a status, 39 reports
    for name in ("x", "acc", "activity"):  # integer sums only
        assert _exactly(a["channels"][name], b["channels"][name])
        windows = [Views(lambda: i, clock=clock).channel_json(name)["windows"]
                   for i in (batched, one_by_one)]
        assert _exactly(*windows)
    yaw_a, yaw_b = a["channels"]["yaw"], b["channels"]["yaw"]
    assert yaw_a["count"] == yaw_b["count"] and yaw_a["histogram"] == yaw_b["histogram"]
    assert math.isclose(yaw_a["circular_mean"], yaw_b["circular_mean"], rel_tol=1e-12)
    p_a, p_b = a["channels"]["p"], b["channels"]["p"]
    assert _exactly(p_a["radius"], p_b["radius"]) and p_a["count"] == p_b["count"]
    for key in ("x", "y"):
        assert math.isclose(p_a["mean_vector"][key], p_b["mean_vector"][key], rel_tol=1e-9)
    assert pickle.loads(pickle.dumps(batched))._batch is None


def test_a_checkpoint_during_a_read_sees_position_and_aggregates_agree(monkeypatch):
    """A member awaits while a batch of the stream arrives, and a checkpoint can run at
    any of those awaits: what it writes must count exactly the messages up to its
    position (a state mid-batch once had agents counting messages the series had not
    applied, and a position past them)."""
    rng = np.random.default_rng(9)
    linear = ClassicalOGPM(epsilon=1.0, low=-2, high=2)
    reports = [protocol.report(agent=f"w{i % 3}", channel="x", kind="linear", seq=i // 3,
                               t=100.0 + i, dt=1.0, mechanism=linear.describe(),
                               codes=rng.integers(0, linear.n_cells, 5).tolist())
               for i in range(12)]
    partition = Partition(0, new(), 0, lease_revision=1)
    seen = []

    async def direct_get(nc, subject, request, *, sentinel, timeout):
        for sequence, payload in enumerate(reports, start=1):
            # what a checkpoint running now would write and the next owner would load
            state = as_json(partition.ingestor.to_state())
            seen.append((partition.sequence, Ingestor.from_state(state)))
            await asyncio.sleep(0)
            yield types.SimpleNamespace(data=payload, headers={
                "Nats-Sequence": str(sequence), "Nats-Last-Sequence": str(sequence - 1),
                "Ldp-Topic": protocol.data_topic(FLEET, f"w{(sequence - 1) % 3}", "x")})

    monkeypatch.setattr(member_module.natsext, "request_many", direct_get)
    fake = types.SimpleNamespace(scale=types.SimpleNamespace(stream="s"),
                                 engine=types.SimpleNamespace(nc=None))
    read, _ = asyncio.run(Member._read_batch(fake, partition))
    assert read == 12 and partition.sequence == 12
    assert partition.ingestor.counters["messages"] == 12
    # Mid-read every state loaded (its agents and series agree: from_state checks it),
    # and it counts nothing past its position: nothing applied, the position unmoved.
    assert len(seen) == 12
    for position, ingestor in seen:
        assert position == 0 and ingestor.counters["messages"] == 0


# -- large states: a KV value naming an object (collector.scaleout.state_objects) ---------------

def test_a_state_object_reference_round_trips_and_a_state_is_not_one():
    name = "p.3." + "ab" * 16
    reference = decode_state_object(encode_state_object(partition=3, name=name, size=2_000_000), 3)
    assert (reference.object, reference.size) == (name, 2_000_000)
    # An inline state, and what is not JSON, are not references (the state's decoder
    # then says what is wrong with them).
    inline = encode_partition_state(Ingestor(fleet=FLEET).to_state(), [], partition=3, partitions=8,
                                    owner="m", now=1.0, every=5.0, sequence=0)
    assert decode_state_object(inline, 3) is None
    assert decode_state_object(b'{"type":"partition-state-object"', 3) is None


@pytest.mark.parametrize("change, reason", [
    ({"partition": 4}, "topic"),  # another partition's object
])
def test_a_reference_to_another_partitions_object_is_rejected(change, reason):
    value = {"v": 1, "type": "partition-state-object", "partition": 3,
             "object": "p.3." + "0" * 32, "size": 10, **change}
    with pytest.raises(protocol.Rejected) as caught:
        decode_state_object(json.dumps(value).encode(), 3)
    assert caught.value.reason == reason


@pytest.mark.parametrize("change", [
    {"object": "../p.3"},  # a name not of our making
    {"object": "p.3." + "0" * 33},
    {"size": -1},
    {"size": (256 << 20) + 1},  # over what any reader accepts
    {"extra": 1},
])
def test_a_malformed_reference_is_not_followed(change):
    value = {"v": 1, "type": "partition-state-object", "partition": 3,
             "object": "p.3." + "0" * 32, "size": 10, **change}
    assert decode_state_object(json.dumps(value).encode(), 3) is None
    with pytest.raises(protocol.Rejected):  # and as a state it is refused, with a reason
        decode_partition_state(json.dumps(value).encode(), 3)


class _FakeObjectStore:
    """What StateObjects needs of nats-py's ObjectStore (unit tests of the logic; the
    real store is exercised in test_scale_out.py)."""

    def __init__(self, objects: dict[str, bytes], sizes: dict[str, int] | None = None):
        self.objects, self.sizes, self.fetched = objects, sizes or {}, []

    async def get_info(self, name):
        if name not in self.objects:
            raise ObjectNotFoundError
        return types.SimpleNamespace(size=self.sizes.get(name, len(self.objects[name])))

    async def get(self, name, writeinto):
        self.fetched.append(name)
        writeinto.write(self.objects[name])


def test_a_reference_reads_its_object_only_when_its_size_is_the_referenced_one():
    name, state = "p.3." + "ab" * 16, b'{"a state": 1}'
    reference = encode_state_object(partition=3, name=name, size=len(state))
    good = StateObjects(_FakeObjectStore({name: state}), inline_bytes=1024)
    assert asyncio.run(good.resolve(3, reference)) == (state, name)
    assert asyncio.run(good.resolve(3, state)) == (state, None)  # inline: itself
    # An object larger than its reference says is not read at all.
    store = _FakeObjectStore({name: state}, sizes={name: 300 << 20})
    with pytest.raises(PartitionStateRejected) as caught:
        asyncio.run(StateObjects(store, inline_bytes=1024).resolve(3, reference))
    assert caught.value.reason == "oversized" and store.fetched == []
    with pytest.raises(StateObjectMissing):  # replaced meanwhile: read the newer value
        asyncio.run(StateObjects(_FakeObjectStore({}), inline_bytes=1024).resolve(3, reference))


def test_a_reference_refused_by_the_feed_is_counted_by_reason_and_keeps_the_state():
    view = MergeView(FLEET, TYPED_SETTINGS)
    good = _document()
    assert view.update_partition("p.1", _payload(good)) == "accepted"
    view.reject_partition("p.1", "oversized", "object p.1.x: 9 bytes, not 3")
    partitions = view.partitions_json()
    assert partitions["partition_rejects"] == {"oversized": 1}
    assert partitions["partitions"]["p0001"]["error"].startswith("oversized")
    assert partitions["partitions"]["p0001"]["owner"] == "m1"  # the last good state stays
