"""Delivery confirmations: what a collector has settled, per agent and channel
(docs/reference/PROTOCOL.md, "Confirmations")."""

from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from edge_agent.protocol.codec import Rejected, decode_checked
from edge_agent.protocol.fields import Finite, Name, Seq
from edge_agent.protocol.statuses import MAX_AGENT_CHANNELS
from edge_agent.protocol.topics import confirm_agent

# -- delivery confirmations (docs/reference/PROTOCOL.md, "Confirmations") --------------------------

# A sequence tracker's settled prefix and its runs (collector.aggregation.dedup).
MAX_CONFIRM_RUNS = 1025
MAX_CONFIRM_BYTES = 4 << 20
SeqRun = tuple[Seq, Seq]


class Confirm(Struct, forbid_unknown_fields=True):
    """Retained on ldp/v1/<fleet>/_confirm/<agent> after each durable checkpoint: per
    channel, the sequence numbers the collector has settled (counted, or refused for
    good), as sorted runs [first, last].  An agent with ``confirm = "collector"`` keeps
    a spooled report until it is in here."""

    v: Literal[1]
    agent: Name
    t: Finite
    channels: Annotated[dict[Name, Annotated[list[SeqRun], Meta(max_length=MAX_CONFIRM_RUNS)]],
                        Meta(max_length=MAX_AGENT_CHANNELS)]


_confirm_decoder = msgspec.json.Decoder(Confirm)


def decode_confirm(topic: str, payload: bytes, fleet: str) -> Confirm:
    """The confirmation on ``topic``, or ``Rejected`` (its agent must be the topic's)."""
    agent = confirm_agent(topic, fleet)
    if agent is None:
        raise Rejected("topic", "not a confirmation topic of this fleet")
    if len(payload) > MAX_CONFIRM_BYTES:
        raise Rejected("oversized", f"{len(payload)} bytes")
    message = decode_checked(_confirm_decoder, payload, {})
    if message.agent != agent:
        raise Rejected("topic", "the agent differs from the topic's")
    return message
