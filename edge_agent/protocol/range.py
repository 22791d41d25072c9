"""Range discovery: a run's control messages, the agents' replies, and its result
(docs/reference/PROTOCOL.md, "Range discovery")."""

from typing import Annotated, Literal, Union

import msgspec
from msgspec import Meta, Struct

from edge_agent.mechanisms.rangefind import MAX_ROUNDS
from edge_agent.protocol.codec import PROTOCOL_VERSION, Rejected, decode_checked, encode
from edge_agent.protocol.fields import (
    Count,
    Epsilon,
    Finite,
    Label,
    Name,
    NonNegative,
    Positive,
    RunId,
    Side,
    Text,
)
from edge_agent.protocol.topics import range_control_topic, range_reply_agent

MAX_RANGE_RESULT_BYTES = 16 * 1024
MAX_RANGE_CONTROL_BYTES = 4096
MAX_RANGE_REPLY_BYTES = 1024
RANGE_WINDOW_MAX = 24 * 3600.0  # seconds of readings an agent keeps for range discovery

# -- range discovery (docs/reference/PROTOCOL.md, "Range discovery") -------------------------------

class _RangeControl(Struct, forbid_unknown_fields=True, tag_field="type"):
    v: Literal[1]
    run: RunId


class RangeTerms(_RangeControl):
    """What a run announced; every round repeats it unchanged."""

    channel: Name
    side: Side
    epsilon: Epsilon
    strategy: Literal["sequential", "split"]
    window_seconds: Annotated[float, Meta(ge=0.0, le=RANGE_WINDOW_MAX)]


class Announce(RangeTerms, tag="announce"):
    domain: tuple[Finite, Finite]


class Round(RangeTerms, tag="round"):
    round: Annotated[int, Meta(ge=0, lt=MAX_ROUNDS)]
    rounds: Annotated[int, Meta(ge=1, le=MAX_ROUNDS)]
    threshold: Annotated[float, Meta(ge=-1e300, le=1e300)]


class End(_RangeControl, tag="end"):
    status: Literal["done", "insufficient"] | None


RangeControl = Union[Announce, Round, End]  # noqa: UP007


def terms_of(message: RangeTerms) -> RangeTerms:
    """The terms alone (what an agent agrees to at join and compares every round with)."""
    return RangeTerms(v=message.v, run=message.run, channel=message.channel, side=message.side,
                      epsilon=message.epsilon, strategy=message.strategy,
                      window_seconds=message.window_seconds)


_control_decoder = msgspec.json.Decoder(RangeControl)


def decode_range_control(topic: str, payload: bytes, fleet: str) -> Announce | Round | End:
    """An announce, round or end on the control topic of its run, or ``Rejected`` saying
    why not."""
    if len(payload) > MAX_RANGE_CONTROL_BYTES:
        raise Rejected("oversized", f"{len(payload)} bytes")
    message = decode_checked(_control_decoder, payload, {})
    if topic != range_control_topic(fleet, message.run):
        raise Rejected("topic", "run id differs from the topic")
    if isinstance(message, Round) and message.round >= message.rounds:
        raise Rejected("schema", "round must be < rounds")
    return message


class _RangeReply(Struct, forbid_unknown_fields=True, tag_field="type"):
    v: Literal[1]
    agent: Name
    run: RunId


class Join(_RangeReply, tag="join", omit_defaults=True):
    accept: bool
    reason: Label | None = None  # why not: disabled, epsilon_above_max, no_data, budget


class Answer(_RangeReply, tag="answer"):
    round: Annotated[int, Meta(ge=0, lt=MAX_ROUNDS)]
    z: Literal[-1, 1]


RangeReply = Union[Join, Answer]  # noqa: UP007


def range_join(*, agent: str, run: str, accept: bool, reason: str | None = None) -> bytes:
    return encode(Join(v=PROTOCOL_VERSION, agent=agent, run=run, accept=accept, reason=reason))


def range_answer(*, agent: str, run: str, round: int, z: int) -> bytes:
    return encode(Answer(v=PROTOCOL_VERSION, agent=agent, run=run, round=round, z=z))


_reply_decoder = msgspec.json.Decoder(RangeReply)


def decode_range_reply(topic: str, payload: bytes, fleet: str, run: str) -> Join | Answer:
    """A join or answer of ``run`` from the agent its topic names, or ``Rejected``:
    ``spoofed`` for another agent's reply, ``malformed`` for anything else."""
    agent = range_reply_agent(topic, fleet, run)
    if agent is None or len(payload) > MAX_RANGE_REPLY_BYTES:
        raise Rejected("malformed", "not a reply of this run")
    try:
        message = decode_checked(_reply_decoder, payload, {})
    except Rejected as exc:
        raise Rejected("malformed", exc.detail) from None
    if message.run != run:
        raise Rejected("malformed", "another run's reply")
    if message.agent != agent:
        raise Rejected("spoofed", "agent differs from the topic")
    return message


class RangeParameters(Struct, forbid_unknown_fields=True):
    strategy: Literal["sequential", "split"]
    epsilon: Epsilon
    rounds: Annotated[int, Meta(ge=1, le=MAX_ROUNDS)]
    h: Finite
    participants: Count
    alpha_min: Positive | None
    answer_epsilon: Epsilon
    window_seconds: NonNegative


class RoundRecord(Struct, forbid_unknown_fields=True):
    round: Annotated[int, Meta(ge=0, lt=MAX_ROUNDS)]
    threshold: Finite
    answers: Count
    phi: float | None  # an estimated share (None if not finite)
    gamma: float | None
    beyond: bool


class RangeResult(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """A run's outcome, retained on ldp/v1/<fleet>/_range/result/<channel>/<side>."""

    v: Literal[1]
    run: RunId
    coordinator: Annotated[Name, Meta(description="[range_discovery] client_id of the "
                                                  "coordinator that ran it")]
    channel: Name
    side: Side
    domain: tuple[Finite, Finite]
    started_at: Finite
    participants: Count | None = None
    refused: dict[Label, Count] | None = None
    status: Literal["done", "insufficient"] | None = None
    reason: Text | None = None
    parameters: RangeParameters | None = None
    estimate: Finite | None = None
    # The search's own error (edge_agent.mechanisms.rangefind.assess); absent in results of older
    # coordinators and of runs that asked no round.
    error_bound: Annotated[NonNegative, Meta(
        description="|estimate - true min (max)| <= error_bound at `confidence`")] | None = None
    interval: Annotated[tuple[Finite, Finite], Meta(
        description="[low, high] holding the true min (max) at `confidence`")] | None = None
    confidence: Annotated[float, Meta(gt=0.0, lt=1.0)] | None = None
    rounds: Annotated[int, Meta(ge=1, le=MAX_ROUNDS)] | None = None
    history: Annotated[list[RoundRecord], Meta(max_length=MAX_ROUNDS)] | None = None
    finished_at: Finite | None = None
    ignored_replies: dict[Label, Count] | None = None


_result_decoder = msgspec.json.Decoder(RangeResult)


def decode_range_result(payload: bytes) -> RangeResult | None:
    """A range result, or None for an empty payload (a cleared retained message)."""
    if not payload:
        return None
    if len(payload) > MAX_RANGE_RESULT_BYTES:
        raise Rejected("oversized", f"{len(payload)} bytes")
    return decode_checked(_result_decoder, payload, {})
