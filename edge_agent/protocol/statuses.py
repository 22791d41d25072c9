"""Agent statuses: retained on ldp/v1/<fleet>/<agent>/status, and the last will
(docs/reference/PROTOCOL.md, "Status")."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from edge_agent.protocol.codec import PROTOCOL_VERSION, Rejected, encode
from edge_agent.protocol.fields import Count, Finite, Label, Name, NonNegative, Positive, Text
from edge_agent.protocol.topics import is_name, status_agent

MAX_AGENT_CHANNELS = 128  # channels (and sources) of one agent: bounds its status
MAX_STATUS_BYTES = 32 * 1024  # a status with MAX_AGENT_CHANNELS channels and sources: ~27 kB

# -- statuses -----------------------------------------------------------------------------------

# A status carries only what the reports themselves show (docs/guides/PRIVACY.md): counters
# that depend on readings (non-finite, clipped, refused) stay on the device.  The
# fields marked "legacy" are what agents before that sent: accepted, so that a fleet
# can be upgraded device by device, and never sent now.

class BudgetStatus(Struct, forbid_unknown_fields=True, omit_defaults=True):
    epsilon: Positive
    spent: NonNegative  # in the rolling window of ``period`` that ends now
    period: Annotated[str, Meta(max_length=32)]  # "10m", "1d": [privacy]'s own words
    period_start: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None  # legacy
    # With [privacy] budget_delta > 0 only: the delta budget and the delta spent in the
    # same window (docs/guides/PRIVACY.md, "δ").
    delta: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    delta_spent: NonNegative | None = None


MAX_GUARANTEES = 8  # [privacy] guarantees of one agent


class ChannelStatus(Struct, forbid_unknown_fields=True, omit_defaults=True):
    exhausted: bool
    reports: Count
    messages: Count
    nan_dropped: Count | None = None  # legacy
    clipped: Count | None = None  # legacy
    budget_refused: Count | None = None  # legacy


class SourceStatus(Struct, forbid_unknown_fields=True, omit_defaults=True):
    finished: bool
    error: Text | None
    rejected_rows: Count | None = None  # legacy


class RangeStatus(Struct, forbid_unknown_fields=True):
    joined: Count
    answered: Count
    refused: dict[Label, Count]
    last_refusal: Label | None


class FleetInfo(Struct, forbid_unknown_fields=True):
    """The fleet simulator's last will: which virtual agents its connection carried."""

    agents: Count
    first: Name
    last: Name


class Status(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    """Retained on ldp/v1/<fleet>/<agent>/status; also the last will (``offline``)."""

    v: Literal[1]
    agent: Name
    state: Literal["online", "offline"]
    t: Finite | None = None
    budget: BudgetStatus | None = None  # the longest guarantee's (agents before guarantees)
    # Every guarantee, shortest window first: its epsilon (and delta) per ``period`` and
    # what was spent in the rolling window of ``period`` that ends now.
    guarantees: Annotated[list[BudgetStatus], Meta(max_length=MAX_GUARANTEES)] | None = None
    channels: Annotated[dict[Name, ChannelStatus],
                        Meta(max_length=MAX_AGENT_CHANNELS)] | None = None
    sources: Annotated[dict[Name, SourceStatus], Meta(max_length=MAX_AGENT_CHANNELS)] | None = None
    range: RangeStatus | None = None
    simulator: FleetInfo | None = None


def status(*, agent: str, state: str, t: float | None = None, **details: Any) -> bytes:
    """An agent's status; ``details`` are the optional fields of ``Status`` as dicts."""
    message = {"v": PROTOCOL_VERSION, "agent": agent, "state": state, **details}
    if t is not None:
        message["t"] = round(t, 3)
    return encode(msgspec.convert(message, Status))


_status_decoder = msgspec.json.Decoder(Status)


def decode_status(topic: str, payload: bytes) -> tuple[str, Status | None]:
    """(the agent the status topic names, its status), the status None for an empty payload
    (a cleared retained message); ``Rejected`` (reason ``status``) otherwise."""
    agent = status_agent(topic)
    if not is_name(agent):
        raise Rejected("status", "not an agent's status topic")
    if not payload:
        return agent, None
    if len(payload) > MAX_STATUS_BYTES:
        raise Rejected("status", f"status of {len(payload)} bytes")
    try:
        message = _status_decoder.decode(payload)
    except msgspec.DecodeError as exc:  # also ValidationError
        raise Rejected("status", f"bad status: {str(exc)[:300]}") from None
    if message.agent != agent:
        raise Rejected("status", "the agent differs from the topic's")
    return agent, message
