"""Reports: one channel's perturbed reports for one batch (grid codes only, never
readings), built by the agent and checked by the collector (docs/reference/PROTOCOL.md, "Reports").

What a type cannot say is checked here right after decoding: which mechanism a channel
kind may carry, the shape of ``codes``, codes inside the mechanism's grid, a topic
naming the sender.  ``decode_report`` returns a ``ValidReport`` (the message, its
mechanism object and its codes as arrays) or raises ``Rejected``."""

import math
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

import msgspec
import numpy as np
from msgspec import Meta, Struct

from edge_agent.mechanisms import Mechanism, kind_accepts
from edge_agent.mechanisms.categorical import FrequencyOracle
from edge_agent.mechanisms.registry import VECTOR
from edge_agent.protocol.codec import PROTOCOL_VERSION, Rejected, decode_checked, encode
from edge_agent.protocol.descriptions import MechanismDescription, describe, mechanism_of
from edge_agent.protocol.fields import (
    MAX_CODES,
    MAX_FIELDS,
    Code,
    CodeList,
    Epsilon,
    Fields,
    Finite,
    Name,
    NonNegative,
    Seed,
    Seq,
    Unit,
)
from edge_agent.protocol.topics import report_levels

MAX_REPORT_BYTES = 1 << 20  # far above a 500-value batch (~4 kB)
Kind = Literal["linear", "circular", "polar", "vector", "categorical"]
KINDS: tuple[str, ...] = Kind.__args__


# -- reports -----------------------------------------------------------------------------------

class Strategy(Struct, frozen=True, forbid_unknown_fields=True):
    """A vector channel's k-of-d sampling: each reading reports k of the d axes at
    ``epsilon / k`` each (k = d is the even split); ``epsilon`` is per reading.  With a
    mechanism of whole vectors (duchi-vector, sampled-duchi) it is the mechanism's own:
    k its axes per reading (d for duchi-vector), epsilon its epsilon."""

    k: Annotated[int, Meta(ge=1, le=MAX_FIELDS)]
    d: Annotated[int, Meta(ge=2, le=MAX_FIELDS)]
    epsilon: Epsilon


_CODES_SHAPE = {"anyOf": [
    {"items": {"type": "integer"},
     "description": "linear, circular: one list of codes; categorical grr: the reported "
                    "categories; olh: the reported buckets"},
    {"items": {"type": "array"},
     "description": "polar: [radius codes, angle codes]; vector: one list per field "
                    "(duchi-vector: a sign code per reading, 1 for +B; sampled-duchi: "
                    "those of the readings that sampled the field); "
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
        # with the hand-written parser (docs/benchmarks/BENCHMARKS.md, "Decoding a report").
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
        if mechanism.name in VECTOR:  # the mechanism's own k of d, at its epsilon
            if getattr(mechanism, "dimensions", None) != len(fields) or strategy is None \
                    or (strategy.k, strategy.d, strategy.epsilon) != (
                        getattr(mechanism, "k", len(fields)), len(fields), mechanism.epsilon):
                return "schema", (f"{mechanism.name} needs one field per dimension and the "
                                  f"strategy {{k, d, epsilon}} of the mechanism")
        elif strategy is None or strategy.d != len(fields) or strategy.k > strategy.d \
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
    hashed = oracle.report_form == "hashed"
    if hashed != (seeds is not None):
        raise Rejected("schema", "olh reports carry seeds, other oracles do not")
    if oracle.report_form in ("category", "hashed"):
        outputs = oracle.buckets if hashed else oracle.categories
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
    if mechanism.name in VECTOR:  # one sign code per reported axis
        parsed = tuple(_grid_codes(part, mechanism.components[0].n_cells) for part in codes)
        problem = mechanism.codes_problem([part.size for part in parsed])
        if problem is not None:
            raise Rejected("shape", problem)
        return parsed
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
