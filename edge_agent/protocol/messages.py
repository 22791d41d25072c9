"""Every message agents and collectors exchange, as typed structs (docs/PROTOCOL.md).

Each message is a msgspec ``Struct`` whose field types carry their bounds, so
decoding and validating are one pass in C.  The agent encodes and the
collector decodes through these types only, and docs/protocol.schema.json is
generated from them (``scripts.gen_protocol_schema``; a test fails when it is
stale).

What a type cannot say is checked here too, right after decoding: which
mechanism a channel kind may carry, the shape of ``codes``, codes inside the
mechanism's grid, a topic naming the sender.  ``decode_report`` returns a
``ValidReport`` (the message, its mechanism object and its codes as arrays) or
raises ``Rejected`` with a short reason that becomes a counter label.

Payloads never contain a raw reading: only grid codes of perturbed values, the
parameters of the mechanism that produced them, and counts.
"""

import math
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, Literal, Union

import msgspec
import numpy as np
from msgspec import Meta, Struct

from edge_agent.mechanisms import (
    DELTA_MAX,
    EPSILON_MAX,
    GRID_BITS_MAX,
    GRID_BITS_MIN,
    MECHANISMS,
    PTT,
    BoundedLaplace,
    CircularOGPM,
    ClassicalOGPM,
    Duchi,
    Mechanism,
    PiecewiseMechanism,
    PolarOGPM,
    SquareWave,
    TruncatedLaplace,
    UnbiasedOGPM,
    from_description,
    kind_accepts,
)
from edge_agent.mechanisms.categorical import (
    LABEL,
    MAX_CATEGORIES,
    MAX_LABELS,
    ORACLES,
    UNIT,
    FrequencyOracle,
)
from edge_agent.mechanisms.rangefind import MAX_ROUNDS
from edge_agent.protocol.topics import (
    NAME_CHARS,
    confirm_agent,
    is_name,
    range_control_topic,
    range_reply_agent,
    report_levels,
    status_agent,
)

PROTOCOL_VERSION = 1
MAX_REPORT_BYTES = 1 << 20  # far above a 500-value batch (~4 kB)
MAX_CODES = 100_000  # per list of codes
# Sequence numbers below 2**53: exact as a JSON number anywhere (JavaScript, doubles); an
# agent sending one report a millisecond takes 285,000 years to get there.
SEQ_LIMIT = 1 << 53
MAX_FIELDS = 64  # axes of a vector channel
MAX_AGENT_CHANNELS = 128  # channels (and sources) of one agent: bounds its status
MAX_STATUS_BYTES = 32 * 1024  # a status with MAX_AGENT_CHANNELS channels and sources: ~27 kB
MAX_RANGE_RESULT_BYTES = 16 * 1024
MAX_RANGE_CONTROL_BYTES = 4096
MAX_RANGE_REPLY_BYTES = 1024
RANGE_WINDOW_MAX = 24 * 3600.0  # seconds of readings an agent keeps for range discovery

_FLOAT_MAX = sys.float_info.max

# -- bounded scalars ---------------------------------------------------------------------------
# "(?!\n)$": Python's "$" also matches before a final newline, JSON Schema's does not.
Name = Annotated[str, Meta(pattern=f"^{NAME_CHARS}(?!\\n)$",
                           description="1-64 characters of A-Z a-z 0-9 . _ -, starting with "
                                       "a letter or digit")]
RunId = Annotated[str, Meta(pattern="^[A-Za-z0-9_.-]{1,64}(?!\\n)$")]
Label = Annotated[str, Meta(max_length=40)]  # a refusal reason or similar short word
CategoryLabel = Annotated[str, Meta(pattern=f"^{LABEL.pattern}(?!\\n)$",
                                    description="a category's name: 1-40 characters, "
                                                "no control characters")]
Unit = Annotated[str, Meta(pattern=f"^{UNIT.pattern}(?!\\n)$",
                           description="a unit of measurement, free text: 1-16 characters, "
                                       "no control characters or braces")]
Seed = Annotated[int, Meta(ge=0, lt=1 << 32)]
Text = Annotated[str, Meta(max_length=1024)]
Finite = Annotated[float, Meta(ge=-_FLOAT_MAX, le=_FLOAT_MAX)]
NonNegative = Annotated[float, Meta(ge=0.0, le=_FLOAT_MAX)]
Positive = Annotated[float, Meta(gt=0.0, le=_FLOAT_MAX)]
Epsilon = Annotated[float, Meta(gt=0.0, le=EPSILON_MAX)]
SplitEpsilon = Annotated[float, Meta(ge=0.0, le=EPSILON_MAX)]  # one side of a polar split
GridBits = Annotated[int, Meta(ge=GRID_BITS_MIN, le=GRID_BITS_MAX)]
Count = Annotated[int, Meta(ge=0, le=2**63 - 1)]
Seq = Annotated[int, Meta(ge=0, lt=SEQ_LIMIT)]
Code = Annotated[int, Meta(ge=0, lt=1 << GRID_BITS_MAX)]
CodeList = Annotated[list[Code], Meta(max_length=MAX_CODES)]
Fields = Annotated[tuple[Name, ...], Meta(min_length=2, max_length=MAX_FIELDS)]
Side = Literal["min", "max"]
Kind = Literal["linear", "circular", "polar", "vector", "categorical"]
KINDS: tuple[str, ...] = Kind.__args__


class Rejected(Exception):
    """A message that breaks the protocol; ``reason`` is a short counter label."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


# -- mechanism descriptions (a mechanism's describe(), tagged by its wire name) ---------------

class _Interval(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name"):
    epsilon: Epsilon
    low: Finite
    high: Finite
    grid_bits: GridBits


class _Compressible(_Interval):
    compressed: bool


class _TwoAtoms(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name"):
    epsilon: Epsilon
    low: Finite
    high: Finite


class _Circle(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name"):
    epsilon: Epsilon
    period: Positive
    origin: Finite
    grid_bits: GridBits


class _PolarPair(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name"):
    epsilon: Epsilon
    radius_max: Positive
    weight: Positive
    period: Positive
    origin: Finite
    grid_bits: GridBits
    epsilon_radius: SplitEpsilon
    epsilon_angle: SplitEpsilon


def define(module: str, name: str, base: type[Struct], tag: str, fields: list = (),
           **options) -> type[Struct]:
    """A struct ``module.name`` with ``base``'s fields and ``fields``, tagged ``tag``: one of
    a family of messages defined by a table.  It is made a module attribute, so it pickles
    and the JSON Schema calls it by its name."""
    cls = msgspec.defstruct(name, list(fields), bases=(base,), tag=tag, module=module,
                            **options)
    setattr(sys.modules[module], name, cls)
    return cls


# Each registered mechanism's parameters (what its describe() gives), by wire name; a
# mechanism registered without a shape here fails at import.
_SHAPES = {ClassicalOGPM: _Interval, UnbiasedOGPM: _Interval, PTT: _Interval,
           TruncatedLaplace: _Interval, BoundedLaplace: _Interval,
           PiecewiseMechanism: _Compressible, SquareWave: _Compressible, Duchi: _TwoAtoms,
           CircularOGPM: _Circle, PolarOGPM: _PolarPair}

class _Categories(Struct, frozen=True, forbid_unknown_fields=True, tag_field="name",
                  omit_defaults=True):
    """A frequency oracle (edge_agent.mechanisms.categorical) over ``categories``
    categories, named by ``labels`` (numbered without)."""

    epsilon: Epsilon
    categories: Annotated[int, Meta(ge=2, le=MAX_CATEGORIES)]
    delta: Annotated[float, Meta(ge=0.0, le=DELTA_MAX)] = 0.0
    labels: Annotated[tuple[CategoryLabel, ...], Meta(max_length=MAX_LABELS)] | None = None


DESCRIPTIONS: dict[str, type[Struct]] = {
    name: define(__name__, f"{cls.__name__}Description", _SHAPES.get(cls, _Categories), name)
    for name, cls in {**MECHANISMS, **ORACLES}.items()}
MechanismDescription = Union[tuple(DESCRIPTIONS.values())]  # noqa: UP007 (built from a tuple)


def description_name(description: Struct) -> str:
    return type(description).__struct_config__.tag


def describe(mechanism: Mechanism | dict) -> Struct:
    """A mechanism's typed description (from the mechanism or its ``describe()`` dict)."""
    described = mechanism if isinstance(mechanism, dict) else mechanism.describe()
    return msgspec.convert(described, MechanismDescription)


@lru_cache(maxsize=4096)  # bounded: a hostile sender cannot grow it
def mechanism_of(description: Struct) -> Mechanism:
    """The mechanism a description names, built once per description (the one cache)."""
    return from_description({"name": description_name(description),
                             **msgspec.structs.asdict(description)})


def as_dict(message: Struct) -> dict:
    """A struct as plain JSON values (tags included), e.g. for the API's documents."""
    return msgspec.to_builtins(message)


# -- reports -----------------------------------------------------------------------------------

class Strategy(Struct, frozen=True, forbid_unknown_fields=True):
    """A vector channel's k-of-d sampling: each reading reports k of the d axes at
    ``epsilon / k`` each (k = d is the even split); ``epsilon`` is per reading."""

    k: Annotated[int, Meta(ge=1, le=MAX_FIELDS)]
    d: Annotated[int, Meta(ge=2, le=MAX_FIELDS)]
    epsilon: Epsilon


_CODES_SHAPE = {"anyOf": [
    {"items": {"type": "integer"},
     "description": "linear, circular: one list of codes; categorical grr: the reported "
                    "categories; olh: the reported buckets"},
    {"items": {"type": "array"},
     "description": "polar: [radius codes, angle codes]; vector: one list per field; "
                    "categorical oue/sue: per value, the categories its bits support, "
                    "ascending"}]}


class Report(Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One channel's perturbed reports for one batch (grid codes only, never readings)."""

    v: Literal[1]
    agent: Name
    channel: Name
    kind: Kind
    seq: Annotated[Seq, Meta(description="per agent and channel, +1 per message, persisted "
                                         "across restarts")]
    t: Annotated[Finite, Meta(description="batch start, seconds since the epoch")]
    dt: Annotated[NonNegative, Meta(description="batch length in seconds")]
    mechanism: MechanismDescription
    codes: Annotated[list[Union[Code, CodeList]],  # noqa: UP007 (msgspec's union of kinds)
                     Meta(max_length=MAX_CODES, extra_json_schema=_CODES_SHAPE)]
    fields: Fields | None = None
    strategy: Strategy | None = None
    seeds: Annotated[list[Seed], Meta(max_length=MAX_CODES, description=(
        "categorical olh: the hash seed of each value, one per bucket in codes"))] | None = None
    unit: Annotated[Unit, Meta(description=(
        "the unit of the reported values as the agent's configuration names it: linear, "
        "vector (every axis), categorical (its bin edges), polar (the radius; the angle's "
        "unit is its mechanism's period: 360 degrees or 2 pi radians); never on circular "
        "reports, whose period is their unit"))] | None = None


@dataclass(frozen=True, slots=True)
class ValidReport:
    """A report that passed every check, with what aggregating it needs.  Its other
    attributes (``agent``, ``channel``, ``seq``, ``t``, ``kind`` ...) are the message's."""

    message: Report
    mechanism: Mechanism  # built from message.mechanism (mechanism_of: cached)
    codes: Any  # int64 array; polar: (radius, angle); vector: one array per field

    def __getattr__(self, name: str):
        if name == "message":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.message, name)


def report(*, agent: str, channel: str, kind: str, seq: int, t: float, dt: float,
           mechanism: dict | Struct, codes: list, fields: list[str] | None = None,
           strategy: dict | Strategy | None = None, seeds: list[int] | None = None,
           unit: str | None = None) -> bytes:
    """One report message.  ``codes``: a list of ints (linear, circular, categorical grr
    and olh), two lists (polar: radius, angle), one list per field (vector) or one list
    per value (categorical oue and sue); ``seeds``: olh's; ``t`` is the batch start and
    ``dt`` its length, in seconds; ``unit``: the values' unit (``Report.unit``)."""
    if isinstance(mechanism, dict):
        mechanism = describe(mechanism)
    if isinstance(strategy, dict):
        strategy = Strategy(**strategy)
    return encode(Report(v=PROTOCOL_VERSION, agent=agent, channel=channel, kind=kind, seq=seq,
                         t=round(t, 3), dt=round(dt, 3), mechanism=mechanism, codes=codes,
                         fields=tuple(fields) if fields is not None else None,
                         strategy=strategy, seeds=seeds, unit=unit))


_report_decoder = msgspec.json.Decoder(Report)
# Where a field's error is reported: (the field itself, an element inside it).
_REPORT_REASONS = {"v": "version", "mechanism": "mechanism", "codes": ("schema", "bad_code"),
                   "seeds": ("schema", "bad_code")}


def decode_report(topic: str, payload: bytes, fleet: str) -> ValidReport:
    """A valid report of ``fleet`` received on ``topic``, or ``Rejected``; never raises
    anything else for any payload."""
    if len(payload) > MAX_REPORT_BYTES:
        raise Rejected("oversized", f"payload of {len(payload)} bytes")
    levels = report_levels(topic, fleet)
    if levels is None:
        raise Rejected("topic", "not a report topic of this fleet")
    if not _braces_pair_up(payload):
        # msgspec would decode (and check) every code before finding the cut-off end:
        # refusing a truncated report must not cost more than accepting a whole one did
        # with the hand-written parser (docs/BENCHMARKS.md, "Decoding a report").
        raise Rejected("json", "not a JSON object (its braces do not pair up)")
    message = decode_checked(_report_decoder, payload, _REPORT_REASONS, not_an_object="json")
    if (message.agent, message.channel) != levels:
        raise Rejected("spoofed", "agent or channel differs from the topic")
    return check_report(message)


def _braces_pair_up(payload: bytes) -> bool:
    """False if ``payload`` cannot be a report: its braces do not pair up.  No string of
    a report may hold a brace (names are [A-Za-z0-9._-]), so every truncated report fails
    this, in two passes of ``bytes.count`` (about 1 µs for 4 kB)."""
    return payload.count(b"{") == payload.count(b"}")


def check_report(message: Report) -> ValidReport:
    """What the types cannot say of a decoded report: its mechanism builds, the kind may
    carry it, and the codes have the kind's shape and lie in the mechanism's grid."""
    try:
        mechanism = mechanism_of(message.mechanism)
    except (TypeError, ValueError) as exc:
        raise Rejected("mechanism", f"invalid mechanism: {exc}") from None
    problem = kind_problem(message.kind, mechanism, message.fields, message.strategy)
    if problem is not None:
        raise Rejected(*problem)
    if message.kind == "circular" and message.unit is not None:
        raise Rejected("schema", "a circular report's unit is its mechanism's period")
    if message.kind == "categorical":
        return ValidReport(message, mechanism, _oracle_reports(message, mechanism))
    if message.seeds is not None:
        raise Rejected("schema", "seeds are for categorical olh reports")
    return ValidReport(message, mechanism, _report_codes(message, mechanism))


def kind_problem(kind: str, mechanism: Mechanism, fields: tuple | None,
                 strategy: Strategy | None) -> tuple[str, str] | None:
    """Why a (kind, mechanism, fields, strategy) series identity is impossible, as
    (reason, detail), or None: for reports and for series loaded from a state."""
    if not kind_accepts(kind, mechanism.name):
        return "kind", f"{kind} channel with mechanism {mechanism.name}"
    if kind == "vector":
        if fields is None or len(set(fields)) != len(fields):
            return "schema", "vector fields must be 2-64 distinct names"
        if strategy is None or strategy.d != len(fields) or strategy.k > strategy.d \
                or not math.isclose(strategy.epsilon / strategy.k, mechanism.epsilon,
                                    rel_tol=1e-9):
            return "schema", "vector strategy must be {k, d, epsilon} matching fields"
    elif fields is not None or strategy is not None:
        # A polar report's mechanism is already a pair: extra fields make it another kind.
        return ("kind" if kind == "polar" else "schema"), \
            "fields/strategy are for vector channels"
    return None


def _oracle_reports(message: Report, oracle: FrequencyOracle):
    """A categorical report's codes as the oracle's ``support`` takes them: grr an int64
    array of categories, olh (seeds, buckets), oue and sue (ones per value, the
    categories of the ones)."""
    codes, seeds = message.codes, message.seeds
    if (oracle.name == "olh") != (seeds is not None):
        raise Rejected("schema", "olh reports carry seeds, other oracles do not")
    if oracle.name in ("grr", "olh"):
        outputs = oracle.buckets if oracle.name == "olh" else oracle.categories
        reported = _grid_codes(codes, outputs)
        if seeds is None:
            return reported
        if len(seeds) != reported.size:
            raise Rejected("shape", "olh needs one seed per bucket")
        return np.array(seeds, dtype=np.uint32), reported
    if not all(isinstance(part, list) for part in codes):
        raise Rejected("shape", "unary codes must be one list of categories per value")
    return _unary_bits(codes, oracle.categories)


def _unary_bits(codes: list[list[int]], categories: int) -> tuple[np.ndarray, np.ndarray]:
    """Per value, the categories its bits support (ascending) -> (how many per value, the
    categories one after the other): the sparse form ``support`` takes, so memory grows
    with the message, not with values x categories.  A category listed twice would count
    twice: refused, as is one beyond the domain."""
    lengths = np.fromiter((len(part) for part in codes), dtype=np.int64, count=len(codes))
    flat = _grid_codes([code for part in codes for code in part], categories)
    rows = np.repeat(np.arange(len(codes)), lengths)
    same_row = rows[1:] == rows[:-1]
    if np.any(flat[1:][same_row] <= flat[:-1][same_row]):
        raise Rejected("bad_code", "a value's categories must be listed once each, ascending")
    return lengths, flat


def _report_codes(message: Report, mechanism: Mechanism):
    codes = message.codes
    if message.kind in ("linear", "circular"):
        return _grid_codes(codes, mechanism.n_cells)
    if not all(isinstance(part, list) for part in codes):
        raise Rejected("shape", f"{message.kind} codes must be lists of codes")
    if message.kind == "polar":
        if len(codes) != 2:
            raise Rejected("shape", "polar codes must be [radius codes, angle codes]")
        radius, angle = mechanism.components
        parsed = (_grid_codes(codes[0], radius.n_cells), _grid_codes(codes[1], angle.n_cells))
        if parsed[0].size != parsed[1].size:
            raise Rejected("shape", "radius and angle code lists differ in length")
        return parsed
    if len(codes) != len(message.fields):
        raise Rejected("shape", "vector codes need one list per field")
    return tuple(_grid_codes(part, mechanism.n_cells) for part in codes)


_NO_CODES = np.empty(0, dtype=np.int64)
_NO_CODES.flags.writeable = False


def _grid_codes(codes: list, n_cells: int) -> np.ndarray:
    """Codes as an int64 array.  The type checked each is an integer in [0, 2**16) or a
    list; a list where codes belong is refused here, and so are codes beyond the grid."""
    if not codes:
        return _NO_CODES
    try:
        array = np.fromiter(codes, dtype=np.int64, count=len(codes))
    except (TypeError, ValueError):  # a list among the codes
        raise Rejected("bad_code", "codes must be integers") from None
    if int(array.max()) >= n_cells:
        raise Rejected("bad_code", f"codes must be in [0, {n_cells - 1}]")
    return array


# -- statuses -----------------------------------------------------------------------------------

# A status carries only what the reports themselves show (docs/PRIVACY.md): counters
# that depend on readings (non-finite, clipped, refused) stay on the device.  The
# fields marked "legacy" are what agents before that sent: accepted, so that a fleet
# can be upgraded device by device, and never sent now.

class BudgetStatus(Struct, forbid_unknown_fields=True, omit_defaults=True):
    epsilon: Positive
    spent: NonNegative  # in the rolling window of ``period`` that ends now
    period: Annotated[str, Meta(max_length=32)]
    period_start: Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)] | None = None  # legacy
    # With [privacy] budget_delta > 0 only: the delta budget and the delta spent in the
    # same window (docs/PRIVACY.md, "δ").
    delta: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None
    delta_spent: NonNegative | None = None


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
    budget: BudgetStatus | None = None
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


# -- delivery confirmations (docs/PROTOCOL.md, "Confirmations") ---------------------------------

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


# -- range discovery (docs/PROTOCOL.md, "Range discovery") --------------------------------------

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


# -- aggregate snapshots (retained on ldp/v1/<fleet>/_aggregates/<channel>; docs/API.md) -----

Estimate = float | None  # None where the data cannot tell (or the value is not finite)


# How a linear channel's mean was estimated (docs/API.md "How the mean is estimated");
# "unbiased", "affine" and "ems" are the names older collectors published.
MeanMethod = Literal["raw", "inversion", "reconstruction", "shrinkage", "unbiased", "affine",
                     "ems"]


class MeanCandidate(Struct, forbid_unknown_fields=True):
    """One estimator the collector considered, and its estimated root mean squared error."""

    estimate: Estimate
    rmse: Estimate


class MeanEstimate(Struct, forbid_unknown_fields=True, kw_only=True):
    raw: Estimate
    estimate: Estimate
    stderr: Estimate
    bias_bound: Estimate
    ci95: tuple[Estimate, Estimate] | None
    method: MeanMethod | None
    candidates: dict[Literal["raw", "inversion", "reconstruction", "shrinkage"],
                     MeanCandidate] | None = None
    note: Text | None = None


class Histogram(Struct, forbid_unknown_fields=True, kw_only=True):
    edges: list[float]
    raw: list[float]
    estimate: list[float] | None
    # What ``estimate`` is: the EM reconstruction (with ``smoothing``, 1 = EMS, 0 =
    # maximum likelihood) or the raw histogram where that is expected to be closer.
    method: Literal["reconstruction", "raw"] | None = None
    smoothing: Annotated[float, Meta(ge=0.0, le=1.0)] | None = None


class LinearSummary(Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    mean: MeanEstimate
    histogram: Histogram
    quantiles: dict[str, Estimate] | None
    count: Count | None = None  # per axis of a vector channel


class ResultantLength(Struct, forbid_unknown_fields=True, kw_only=True):
    """The reports' mean resultant length (``raw``) and the readings' (``estimate``:
    bias-corrected, divided by rho(eps), not clipped, so noise can take it above 1),
    its standard error and 95% interval (within [0, 1]); collector.estimation.circular."""

    raw: Estimate
    estimate: Estimate
    stderr: Estimate = None
    ci95: tuple[Estimate, Estimate] | None = None


class DirectionInterval(Struct, forbid_unknown_fields=True, kw_only=True):
    """The mean direction's standard error and 95% interval, circular_mean ± half_width
    (``ci95`` runs counter-clockwise from its first end to its second, through the
    origin where the first is larger); null, with ``reason``, where the reports cannot
    give a direction."""

    stderr: Estimate
    half_width: Estimate
    ci95: tuple[Estimate, Estimate] | None
    reason: Text | None


class CircularSummary(Struct, forbid_unknown_fields=True, kw_only=True):
    circular_mean: Estimate
    direction: DirectionInterval | None = None  # None: published by an older collector
    resultant_length: ResultantLength
    circular_std: Estimate
    circular_std_reason: Text | None = None
    # The covariance behind the intervals: the reports' sample covariance, or a bound
    # (aggregates restored from a state without the doubled-angle sums).
    covariance: Literal["sample", "bound"] | None = None
    histogram: Histogram


class MeanVector(Struct, forbid_unknown_fields=True):
    x: Estimate
    y: Estimate
    magnitude: Estimate
    direction: Estimate


class PolarSummary(Struct, forbid_unknown_fields=True, kw_only=True):
    radius: LinearSummary
    angle: CircularSummary
    mean_vector: MeanVector


class VectorSummary(Struct, forbid_unknown_fields=True, kw_only=True):
    axes: dict[Name, LinearSummary]
    strategy: Strategy


class Frequencies(Struct, forbid_unknown_fields=True):
    """Per category (in ``labels`` order): the share of reports supporting it, the
    unbiased share, its standard error and 95% interval, and the consistent share
    (non-negative, summing to 1: Norm-Sub)."""

    labels: list[CategoryLabel]
    raw: list[Estimate]
    estimate: list[Estimate]
    stderr: list[Estimate]
    ci95: list[tuple[Estimate, Estimate] | None]
    shares: list[Estimate]


class CategoricalSummary(Struct, forbid_unknown_fields=True, kw_only=True):
    frequencies: Frequencies


class OtherSeries(Struct, forbid_unknown_fields=True):
    mechanism: MechanismDescription
    count: Count


# A channel's snapshot (its entry of GET /api/channels): what the channel is, then its
# kind's summary, side by side in one object.
_SNAPSHOT_HEADER = [("channel", Name), ("t", Finite), ("mechanism", MechanismDescription),
                    ("count", Count), ("messages", Count), ("agents", Count),
                    ("other_series", list[OtherSeries]), ("unit", Unit | None, None),
                    ("angle_unit", Literal["rad", "deg"] | None, None)]
SNAPSHOTS: dict[str, type[Struct]] = {
    kind: define(__name__, f"{kind.title()}Snapshot", summary, kind, _SNAPSHOT_HEADER,
                 tag_field="kind")
    for kind, summary in (("linear", LinearSummary), ("circular", CircularSummary),
                          ("polar", PolarSummary), ("vector", VectorSummary),
                          ("categorical", CategoricalSummary))}
ChannelSnapshot = Union[tuple(SNAPSHOTS.values())]  # noqa: UP007


def snapshot(view: dict, *, channel: str, t: float) -> bytes:
    """A channel's API entry (``Views``) as its typed snapshot message: the cumulative
    aggregates (the entry's latest ``window`` is the API's, for charts, left out)."""
    summary = {key: value for key, value in view.items() if key != "window"}
    return encode(msgspec.convert({**summary, "channel": channel, "t": t}, ChannelSnapshot))


# -- encoding and decoding ---------------------------------------------------------------------

_encoder = msgspec.json.Encoder()


def encode(message: Struct) -> bytes:
    """Compact JSON; a non-finite float becomes null (JSON has no NaN)."""
    return _encoder.encode(message)


# " - at `$.codes[3]`" ends a validation error about a field; errors about the document
# itself ("Object missing required field `seq`") name no path.
_ERROR_PATH = re.compile(r" - at `\$\.?([A-Za-z_]*)(.*)`$")


def decode_checked(decoder: msgspec.json.Decoder, payload: bytes, reasons: dict,
            not_an_object: str = "schema"):
    """``decoder.decode(payload)``, or ``Rejected``: ``json`` for what is not JSON,
    ``not_an_object`` for a document that is not an object, ``reasons[field]`` for an
    error in that field (a pair: (the field itself, an element inside it)), else
    ``schema``."""
    try:
        return decoder.decode(payload)
    except msgspec.ValidationError as exc:
        text = str(exc)
        match = _ERROR_PATH.search(text)
        if match is None:
            reason = not_an_object if text.startswith("Expected `object`") else "schema"
        else:
            field, inside = match.groups()
            reason = reasons.get(field, "schema")
            if isinstance(reason, tuple):
                reason = reason[1] if inside else reason[0]
        raise Rejected(reason, text[:300]) from None
    except msgspec.DecodeError as exc:  # not JSON at all (or not UTF-8)
        raise Rejected("json", str(exc)[:300]) from None
    except UnicodeDecodeError as exc:  # msgspec's error for a string that is not UTF-8
        raise Rejected("json", str(exc)[:300]) from None

