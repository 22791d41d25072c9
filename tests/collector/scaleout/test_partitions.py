"""Partitions and message ids of the scale-out ingress: pure functions of the topic."""

from __future__ import annotations

import pytest

from collector.scaleout.partitions import agent_of, message_id, partition_of, subject
from edge_agent import protocol
from edge_agent.mechanisms import ClassicalOGPM

# FNV-1a, 32 bits: published test vectors (Fowler/Noll/Vo).
FNV_VECTORS = {"": 0x811C9DC5, "a": 0xE40C292C, "foobar": 0xBF9CF968}


@pytest.mark.parametrize("text, digest", FNV_VECTORS.items())
def test_the_partition_is_fnv1a_of_the_agent_id(text, digest):
    for count in (1, 7, 32, 1024):
        assert partition_of(text, count) == digest % count


def test_every_partition_gets_agents():
    counts = [0] * 32
    for i in range(3200):
        counts[partition_of(f"wearable-{i:04d}", 32)] += 1
    assert min(counts) > 50  # 100 expected each; a bad hash would leave some empty


def report(seq: int) -> tuple[str, bytes]:
    mechanism = ClassicalOGPM(epsilon=1.0, low=-2, high=2)
    return protocol.data_topic("demo", "w.1", "x"), protocol.report(
        agent="w.1", channel="x", kind="linear", seq=seq, t=1.0, dt=1.0,
        mechanism=mechanism.describe(), codes=[1, 2])


def test_a_report_is_identified_by_agent_channel_and_seq():
    assert message_id(*report(2**53 - 1), "demo") == f"w.1/x/{2**53 - 1}"
    assert agent_of(report(0)[0], "demo") == "w.1"
    assert subject("ldp_reports", 5) == "ldp_reports.5"


@pytest.mark.parametrize("topic, payload", [
    ("ldp/v1/demo/w1/status", b'{"v":1,"agent":"w1","seq":3}'),  # a status: no id
    ("ldp/v1/demo/w1/x", b'{"v":1,"codes":[1,2]}'),  # no seq
    ("ldp/v1/demo/w1/x", b'{"seq":12345678901234567890}'),  # beyond the digits a seq has
    ("ldp/v1/demo/w1/x", b'{"seq":"7"}'),  # not a number
    ("ldp/v1/other/w1/x", b'{"seq":7}'),  # another fleet
])
def test_messages_without_an_identity_get_none(topic, payload):
    assert message_id(topic, payload, "demo") is None


def test_only_fleet_messages_have_an_agent():
    assert agent_of("ldp/v1/demo/_range/control/r1", "demo") is None
    assert agent_of("ldp/v1/other/w1/x", "demo") is None
    assert agent_of("ldp/v1/demo/w1/status", "demo") == "w1"
