"""The typed protocol: the schema file is generated from the types, every message the
agent and collector write decodes through them and validates against the schema, and
mechanism names come from one registry."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from collector.storage import states
from edge_agent import protocol
from edge_agent.config import LinearMechanism, OgpmOnly
from edge_agent.config.channels import VectorMechanism
from edge_agent.mechanisms import (
    MECHANISMS,
    CircularOGPM,
    ClassicalOGPM,
    PolarOGPM,
    UnbiasedOGPM,
    linear_mechanism,
)
from edge_agent.mechanisms.categorical import LONGITUDINAL, ORACLES
from edge_agent.mechanisms.registry import (
    AUTO,
    KIND_CONFIG_NAMES,
    LINEAR,
    VECTOR,
    kind_accepts,
)
from edge_agent.protocol import descriptions
from tests.support import REPO
from tests.support.paths import load_script
from tests.support.schema import SCHEMA, protocol_validator

schema = load_script("gen_protocol_schema")

FLEET = "demo"
validator = protocol_validator


def test_schema_file_is_generated_from_the_types():
    assert (REPO / "docs" / "reference" / "protocol.schema.json").read_text() == schema.render(), \
        "docs/reference/protocol.schema.json is stale: run `make docs`"


def test_every_topic_names_a_definition():
    assert set(SCHEMA["x-topics"]) == set(schema.MESSAGES)
    for topic, ref in SCHEMA["x-topics"].items():
        refs = [r["$ref"] for r in ref.get("anyOf", [ref])]
        assert all(r.removeprefix("#/$defs/") in SCHEMA["$defs"] for r in refs), topic


# -- one registry of mechanism names -------------------------------------------------------

def test_mechanism_names_come_from_one_registry():
    every = set(MECHANISMS) | set(VECTOR) | set(ORACLES) | set(LONGITUDINAL)
    assert set(descriptions.DESCRIPTIONS) == every
    assert set(LinearMechanism.__args__) == {*LINEAR, AUTO} == set(KIND_CONFIG_NAMES["linear"])
    scalar = {name for name in LINEAR if not LINEAR[name].delta}  # a vector's axes: pure
    assert set(VectorMechanism.__args__) == {*scalar, AUTO, *VECTOR} \
        == set(KIND_CONFIG_NAMES["vector"])
    assert OgpmOnly.__args__ == KIND_CONFIG_NAMES["circular"] == KIND_CONFIG_NAMES["polar"]
    mapping = SCHEMA["properties"]["mechanism"]["discriminator"]["mapping"]
    assert set(mapping) == every
    for name in VECTOR:  # a mechanism of whole vectors is for vector channels only
        assert kind_accepts("vector", name)
        assert not any(kind_accepts(kind, name) for kind in ("linear", "circular", "polar",
                                                             "categorical"))
    for name in [*ORACLES, *LONGITUDINAL]:  # a frequency oracle is for categorical only
        assert kind_accepts("categorical", name)
        assert not any(kind_accepts(kind, name) for kind in ("linear", "circular", "polar",
                                                             "vector"))
    assert not any(kind_accepts("categorical", name) for name in MECHANISMS)
    for name in LINEAR:  # every configuration name builds a mechanism the wire knows
        built = linear_mechanism(name, epsilon=1.0, low=-1.0, high=1.0, grid_bits=8,
                                 delta=1e-6 if LINEAR[name].delta else 0.0)
        assert built.name in MECHANISMS and kind_accepts("linear", built.name)
        assert not kind_accepts("circular", built.name) and not kind_accepts("polar", built.name)
    assert kind_accepts("circular", CircularOGPM.name) and kind_accepts("polar", PolarOGPM.name)


@pytest.mark.parametrize("name", sorted(MECHANISMS))
def test_every_description_round_trips_to_the_same_mechanism(name):
    mechanism = {"ogpm-circular": lambda: CircularOGPM(epsilon=1.5),
                 "ogpm-polar": lambda: PolarOGPM(epsilon=4.0, radius_max=2.0)}.get(
        name, lambda: next(c.build(epsilon=1.5, low=-2.0, high=2.0, grid_bits=10,
                                   delta=1e-6 if c.delta else 0.0)
                           for c in LINEAR.values() if c.cls.name == name))()
    description = protocol.describe(mechanism)
    assert protocol.description_name(description) == name
    assert protocol.mechanism_of(description) == mechanism
    # one cache: the same description (even decoded anew) gives the same object
    again = msgspec.json.decode(protocol.encode(description), type=protocol.MechanismDescription)
    assert protocol.mechanism_of(again) is protocol.mechanism_of(description)
    validator().validate(json.loads(_report_of(mechanism)))


@pytest.mark.parametrize("name", sorted(ORACLES))
@pytest.mark.parametrize("labels", [None, ("rest", "walk", "run")])
def test_every_oracle_description_round_trips_with_its_labels(name, labels):
    oracle = ORACLES[name](epsilon=1.5, categories=3, delta=1e-6, labels=labels)
    description = protocol.describe(oracle)
    again = msgspec.json.decode(protocol.encode(description), type=protocol.MechanismDescription)
    assert protocol.mechanism_of(again) == oracle and protocol.mechanism_of(again).labels == labels


# -- what the agent writes decodes, and matches the published schema -----------------------

def _report_of(mechanism, **changes) -> bytes:
    kind = {"ogpm-circular": "circular", "ogpm-polar": "polar"}.get(mechanism.name, "linear")
    if mechanism.name in ORACLES:
        kind = "categorical"
    codes = [[1, 2], [3, 4]] if kind == "polar" else [0, 1]
    message = dict(agent="w1", channel="ch", kind=kind, seq=3, t=1.7e9, dt=1.0,
                   mechanism=mechanism.describe(), codes=codes)
    return protocol.report(**{**message, **changes})


def _categorical_report(name: str, codes, **changes) -> bytes:
    oracle = ORACLES[name](epsilon=1.0, categories=3, labels=("rest", "walk", "run"))
    return _report_of(oracle, kind="categorical", codes=codes, **changes)


REPORTS = {
    "linear": lambda: _report_of(ClassicalOGPM(epsilon=1.0, low=-2, high=2)),
    "circular": lambda: _report_of(CircularOGPM(epsilon=1.0)),
    "polar": lambda: _report_of(PolarOGPM(epsilon=4.0, radius_max=2.0)),
    "vector": lambda: _report_of(UnbiasedOGPM(epsilon=0.5, low=-1, high=1), kind="vector",
                                 codes=[[1], [], [2, 3]], fields=["x", "y", "z"],
                                 strategy={"k": 2, "d": 3, "epsilon": 1.0}),
    "categorical-grr": lambda: _categorical_report("grr", [0, 2, 1, 0]),
    "categorical-olh": lambda: _categorical_report("olh", [0, 2, 1], seeds=[7, 2**32 - 1, 0]),
    "categorical-oue": lambda: _categorical_report("oue", [[0, 2], [], [1]]),
}
# What each categorical report supports: per category, how many of its values.
SUPPORTED = {"categorical-grr": [2, 1, 1], "categorical-oue": [1, 1, 1]}


@pytest.mark.parametrize("kind", REPORTS)
def test_reports_decode_with_their_mechanism_and_codes(kind):
    payload = REPORTS[kind]()
    validator().validate(json.loads(payload))
    report = protocol.decode_report(protocol.data_topic(FLEET, "w1", "ch"), payload, FLEET)
    assert report.kind == kind.split("-")[0] and report.seq == 3
    assert report.mechanism is protocol.mechanism_of(report.message.mechanism)
    if kind in SUPPORTED:
        assert report.mechanism.support(report.codes).tolist() == SUPPORTED[kind]
    elif kind == "categorical-olh":
        seeds, buckets = report.codes
        assert seeds.tolist() == [7, 2**32 - 1, 0] and buckets.tolist() == [0, 2, 1]
    else:
        codes = report.codes if kind in ("polar", "vector") else [report.codes]
        assert all(part.dtype == np.int64 for part in codes)
    # the typed message encodes back to the same JSON
    assert json.loads(protocol.encode(report.message)) == json.loads(payload)


@pytest.mark.parametrize("kind", REPORTS)
def test_every_truncation_of_a_report_is_refused_as_json(kind):
    """Cut anywhere (also right after an inner object, where it still ends with "}"), a
    report is refused as not JSON, before its codes are decoded (docs/benchmarks/BENCHMARKS.md)."""
    payload, topic = REPORTS[kind](), protocol.data_topic(FLEET, "w1", "ch")
    for cut in range(len(payload)):
        with pytest.raises(protocol.Rejected) as refused:
            protocol.decode_report(topic, payload[:cut], FLEET)
        assert refused.value.reason == "json", (cut, payload[:cut])


def test_every_status_the_agent_writes_decodes_and_validates():
    full = protocol.status(
        agent="w1", state="online", t=1.7e9,
        budget={"epsilon": 5.0, "spent": 1.5, "period": "1d", "period_start": 1_700_000_000},
        channels={"ax": {"exhausted": False, "nan_dropped": 0, "clipped": 3, "reports": 41,
                         "budget_refused": 0, "messages": 41}},
        sources={"imu": {"finished": False, "error": None, "rejected_rows": 0}},
        range={"joined": 1, "answered": 1, "refused": {"budget": 1}, "last_refusal": "budget"})
    will = protocol.status(agent="w1", state="offline",
                           simulator={"agents": 3, "first": "w1-0", "last": "w1-2"})
    for payload in (full, will):
        validator("Status").validate(json.loads(payload))
        assert protocol.decode_status("ldp/v1/demo/w1/status", payload)[1].agent == "w1"
    with pytest.raises(msgspec.ValidationError):  # the agent cannot write what is not typed
        protocol.status(agent="w1", state="online", budget={"epsilon": "lots"})


def test_range_messages_round_trip_and_validate():
    terms = dict(v=1, run="ax-min-1-abc", channel="ax", side="min", epsilon=1.0,
                 strategy="split", window_seconds=300.0)
    for message in (protocol.Announce(**terms, domain=(-2.0, 2.0)),
                    protocol.Round(**terms, round=0, rounds=3, threshold=0.5),
                    protocol.End(v=1, run=terms["run"], status="done")):
        payload = protocol.encode(message)
        validator(type(message).__name__).validate(
            json.loads(payload))
        topic = protocol.range_control_topic(FLEET, message.run)
        assert protocol.decode_range_control(topic, payload, FLEET) == message
    for payload in (protocol.range_join(agent="w1", run="r1", accept=False, reason="budget"),
                    protocol.range_answer(agent="w1", run="r1", round=2, z=-1)):
        topic = protocol.range_reply_topic(FLEET, "w1", "r1")
        decoded = protocol.decode_range_reply(topic, payload, FLEET, "r1")
        validator(type(decoded).__name__).validate(json.loads(payload))
        assert protocol.encode(decoded) == payload


@pytest.mark.parametrize("payload, reason", [
    (b'{"v":1,"type":"round","run":"r","channel":"ax","side":"min","epsilon":1,'
     b'"strategy":"split","window_seconds":1,"round":3,"rounds":3,"threshold":0}', "schema"),
    (b'{"v":1,"type":"announce"}', "schema"),
    (b'{"v":1,"type":"gossip","run":"r"}', "schema"),
    (b'{"v":1,"type":"end","run":"../x","status":null}', "schema"),
    (b"not json", "json"),
    (b"x" * 5000, "oversized"),
])
def test_bad_range_control_is_rejected_with_a_reason(payload, reason):
    with pytest.raises(protocol.Rejected) as caught:
        protocol.decode_range_control(protocol.range_control_topic(FLEET, "r"), payload, FLEET)
    assert caught.value.reason == reason


def test_range_results_and_snapshots_validate_against_their_definitions():
    result = protocol.RangeResult(v=1, run="r1", coordinator="c", channel="ax", side="max",
                                  domain=(-1.0, 1.0), started_at=1.0, participants=0, refused={},
                                  status="insufficient", reason="0 agents joined",
                                  finished_at=2.0, ignored_replies={})
    payload = protocol.encode(result)
    validator("RangeResult").validate(json.loads(payload))
    assert protocol.decode_range_result(payload) == result


def test_range_results_carry_their_error_bound_and_older_ones_still_load():
    bounded = protocol.RangeResult(v=1, run="r1", coordinator="c", channel="ax", side="min",
                                   domain=(-1.0, 1.0), started_at=1.0, status="insufficient",
                                   reason="4 agents: the search's error bound ±1.5 is wider "
                                          "than the domain [-1, 1]",
                                   estimate=0.5, error_bound=1.5, interval=(-1.0, 1.0),
                                   confidence=0.95, rounds=1)
    payload = protocol.encode(bounded)
    validator("RangeResult").validate(json.loads(payload))
    assert protocol.decode_range_result(payload) == bounded
    # retained by a coordinator from before error bounds: loads, without them
    older = (b'{"v":1,"run":"r0","coordinator":"c","channel":"ax","side":"min",'
             b'"domain":[-20.0,20.0],"started_at":1.0,"status":"done","estimate":-3.91,'
             b'"rounds":9,"participants":1000}')
    loaded = protocol.decode_range_result(older)
    assert loaded.estimate == -3.91 and loaded.error_bound is None and loaded.interval is None
    for bad in ({"error_bound": -0.1}, {"confidence": 1.0}, {"interval": [0.0]}):
        with pytest.raises(protocol.Rejected):
            protocol.decode_range_result(json.dumps(json.loads(older) | bad).encode())


def test_partition_states_and_checkpoints_are_versioned():
    state = states.IngestorState(
        fleet=FLEET, settings=states.AggregateSettings(bins=10, window_seconds=60.0,
                                                       keep_windows=5),
        rejects={}, agents={}, series=[], latest={}, dead_letters=[])
    document = states.encode_partition_state(state, [], partition=3, partitions=8, owner="m1",
                                             now=1.0, every=5.0, sequence=7)
    validator("PartitionState").validate(json.loads(document))
    assert states.decode_partition_state(document, 3).state == state
    other = json.loads(document) | {"v": states.PARTITION_STATE_VERSION + 1}
    with pytest.raises(protocol.Rejected) as caught:
        states.decode_partition_state(json.dumps(other).encode(), 3)
    assert caught.value.reason == "version"
    checkpoint = states.encode_checkpoint(state, [], [])
    assert states.decode_checkpoint(checkpoint).state == state
