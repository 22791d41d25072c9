"""Reports of the mechanisms of whole vectors (duchi-vector, sampled-duchi): the wire form
the agent writes decodes back to its codes and validates against the schema, every field
is bounded, and what does not fit the mechanism is refused by type or by check."""

from __future__ import annotations

import json

import msgspec
import numpy as np
import pytest

from edge_agent import protocol
from edge_agent.mechanisms import from_description
from edge_agent.mechanisms.multidimensional import DuchiVector, SampledDuchi
from tests.support.schema import protocol_validator

FLEET = "demo"
TOPIC = protocol.data_topic(FLEET, "w1", "acc")
FIELDS = ["ax", "ay", "az"]
DUCHI = DuchiVector(epsilon=2.0, dimensions=3, delta=1e-6, low=-4.0, high=4.0)
SAMPLED = SampledDuchi(epsilon=3.0, dimensions=3, k=2, low=0.0, high=10.0)


def payload(mechanism, codes, **changes) -> bytes:
    message = dict(agent="w1", channel="acc", kind="vector", seq=5, t=1.7e9, dt=1.0,
                   mechanism=mechanism.describe(), codes=codes, fields=FIELDS,
                   strategy={"k": getattr(mechanism, "k", 3), "d": 3,
                             "epsilon": mechanism.epsilon}, unit="g")
    return protocol.report(**{**message, **changes})


def as_json(mechanism, codes, **changes) -> dict:
    return json.loads(payload(mechanism, codes, **changes))


def decode(document: dict | bytes):
    raw = document if isinstance(document, bytes) else json.dumps(document).encode()
    return protocol.decode_report(TOPIC, raw, FLEET)


@pytest.mark.parametrize("mechanism", [DUCHI, SAMPLED], ids=["duchi-vector", "sampled-duchi"])
def test_what_the_mechanism_writes_round_trips_through_the_typed_protocol(mechanism):
    values = np.random.default_rng(1).uniform(mechanism.low, mechanism.high, (50, 3))
    codes = [part.tolist() for part in mechanism.perturb_codes(values,
                                                               np.random.default_rng(2))]
    raw = payload(mechanism, codes)
    protocol_validator().validate(json.loads(raw))
    report = decode(raw)
    assert report.mechanism == mechanism
    assert report.mechanism is protocol.mechanism_of(report.message.mechanism)
    assert [part.tolist() for part in report.codes] == codes
    assert all(part.dtype == np.int64 for part in report.codes)
    assert json.loads(protocol.encode(report.message)) == json.loads(raw)
    # the description rebuilds the mechanism, also from the plain dict
    assert from_description(mechanism.describe()) == mechanism
    again = msgspec.json.decode(protocol.encode(protocol.describe(mechanism)),
                                type=protocol.MechanismDescription)
    assert protocol.mechanism_of(again) == mechanism


def _set(document: dict, path: str, value) -> dict:
    target = document
    *parents, last = path.split(".")
    for key in parents:
        target = target[key]
    target[last] = value
    return document


# (mechanism, codes, change to the message, reason)
MALFORMED = [
    # codes: signs 0 or 1 only, whole lists, one per field
    (DUCHI, [[0, 2], [1, 0], [1, 1]], None, "bad_code"),
    (DUCHI, [[0, -1], [1, 0], [1, 1]], None, "bad_code"),
    (DUCHI, [[0, [1]], [1, 0], [1, 1]], None, "bad_code"),
    (DUCHI, [[0, 1], [1, 0]], None, "shape"),
    (DUCHI, [0, 1, 1], None, "shape"),
    # duchi-vector: every reading a whole sign vector
    (DUCHI, [[0, 1], [1], [1, 1]], None, "shape"),
    # sampled-duchi: k codes per reading
    (SAMPLED, [[0, 1], [1], [1, 1]], None, "shape"),
    (SAMPLED, [[0, 2], [1], [1]], None, "bad_code"),
    # the description: bounded, and it must build
    (DUCHI, [[0], [1], [1]], ("mechanism.dimensions", 63), "mechanism"),
    (DUCHI, [[0], [1], [1]], ("mechanism.dimensions", 0), "mechanism"),
    (DUCHI, [[0], [1], [1]], ("mechanism.delta", 0.5), "mechanism"),
    (DUCHI, [[0], [1], [1]], ("mechanism.delta", -1e-9), "mechanism"),
    (DUCHI, [[0], [1], [1]], ("mechanism.epsilon", 0.0), "mechanism"),
    (DUCHI, [[0], [1], [1]], ("mechanism.low", 5.0), "mechanism"),
    (DUCHI, [[0], [1], [1]], ("mechanism.k", 2), "mechanism"),
    (SAMPLED, [[0], [1], []], ("mechanism.k", 4), "mechanism"),
    (SAMPLED, [[0], [1], []], ("mechanism.k", 0), "mechanism"),
    (SAMPLED, [[0], [1], []], ("mechanism.k", True), "mechanism"),
    # fields and strategy: the mechanism's own
    (DUCHI, [[0], [1], [1]], ("mechanism.dimensions", 4), "schema"),
    (DUCHI, [[0], [1], [1]], ("strategy", None), "schema"),
    (DUCHI, [[0], [1], [1]], ("strategy.k", 1), "schema"),
    (DUCHI, [[0], [1], [1]], ("strategy.epsilon", 0.5), "schema"),
    (SAMPLED, [[0], [1], []], ("strategy.k", 3), "schema"),
    (DUCHI, [[0], [1], [1]], ("fields", None), "schema"),
    # the kind: a vector channel's only
    (DUCHI, [[0], [1], [1]], ("kind", "linear"), "kind"),
]


@pytest.mark.parametrize("mechanism, codes, change, reason", MALFORMED)
def test_malformed_reports_are_refused_with_a_reason(mechanism, codes, change, reason):
    document = json.loads(msgspec.json.encode(dict(
        v=1, agent="w1", channel="acc", kind="vector", seq=5, t=1.7e9, dt=1.0,
        mechanism=mechanism.describe(), codes=codes, fields=FIELDS,
        strategy={"k": getattr(mechanism, "k", 3), "d": 3, "epsilon": mechanism.epsilon})))
    if change is not None:
        path, value = change
        if value is None:
            document.pop(path)
        else:
            _set(document, path, value)
    with pytest.raises(protocol.Rejected) as refused:
        decode(document)
    assert refused.value.reason == reason, refused.value


def test_an_empty_message_of_either_is_well_formed():
    for mechanism in (DUCHI, SAMPLED):
        report = decode(as_json(mechanism, [[], [], []]))
        assert [part.size for part in report.codes] == [0, 0, 0]
