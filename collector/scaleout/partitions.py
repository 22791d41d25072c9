"""Which partition a message belongs to, and its message id: pure functions of the topic.

Every message of one agent (its reports on every channel, its status) goes to one
partition, so one member at a time sees all copies of that agent's reports and
deduplicates them exactly.  The partition is FNV-1a (32 bits) of the agent id
modulo the stream's partition count: stable across processes, machines and
Python versions (``hash()`` is salted per process), and the same in every
ingress.  The count is fixed when the stream is created (a change would move
agents between partitions while old copies sit in the stream).
"""

from __future__ import annotations

import functools
import re

from edge_agent import protocol

FNV_OFFSET, FNV_PRIME = 0x811C9DC5, 0x01000193
# The report's own sequence number, for the stream's duplicate window.  Our agents
# write "seq" before "codes"; a payload that puts another "seq" first can only
# shadow its own sender's reports (the agent id comes from the topic).
SEQ = re.compile(rb'"seq"\s*:\s*(\d{1,16})[,}\s]')


@functools.lru_cache(maxsize=1 << 16)  # per message in the ingress: an agent's is fixed
def partition_of(agent: str, partitions: int) -> int:
    digest = FNV_OFFSET
    for byte in agent.encode():
        digest = ((digest ^ byte) * FNV_PRIME) & 0xFFFFFFFF
    return digest % partitions


def agent_of(topic: str, fleet: str) -> str | None:
    """The agent a report or status topic of ``fleet`` comes from; None for others."""
    if protocol.classify(topic, fleet) == "ignore":
        return None
    agent = topic.split("/")[3]
    return agent if protocol.is_name(agent) else None


def subject(stream: str, partition: int) -> str:
    return f"{stream}.{partition}"


def message_id(topic: str, payload: bytes, fleet: str) -> str | None:
    """``<agent>/<channel>/<seq>`` of a report (its identity for the duplicate window);
    None for a status or a payload without a sequence number."""
    levels = protocol.report_levels(topic, fleet)
    if levels is None or levels[1] == "status":
        return None
    found = SEQ.search(payload, 0, 4096)
    return f"{levels[0]}/{levels[1]}/{int(found.group(1))}" if found else None
