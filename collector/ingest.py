"""Validating and aggregating report messages (no I/O here; see ``service.py``).

``Ingestor.ingest(topic, payload)`` checks one message against the protocol
(docs/PROTOCOL.md, docs/protocol.schema.json), drops duplicates by
(agent, channel, seq), and adds the codes to the channel's series.  A message
that fails any check is rejected, counted by reason and kept (truncated) in a
bounded dead-letter log; it changes no aggregate.  Checks are written by hand
rather than with a JSON-schema library so that a message costs microseconds;
tests keep them in agreement with the schema file.

The whole ``Ingestor`` pickles: it is the collector's checkpoint.
"""

from __future__ import annotations

import collections
import math
import re
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from edge_agent.mechanisms import from_description
from edge_agent.protocol import PROTOCOL_VERSION, TOPIC_ROOT

from .series import Series, describe_key, series_identity

MAX_PAYLOAD_BYTES = 1 << 20  # far above a 500-value batch (~4 kB)
MAX_CODES = 100_000
DEAD_LETTERS = 200
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
REPORT_KEYS = {"v", "agent", "channel", "kind", "seq", "t", "dt", "mechanism", "codes"}
OPTIONAL_KEYS = {"fields", "strategy"}
_MECHANISM_CACHE: dict[str, Any] = {}


class Rejected(Exception):
    """A message that breaks the protocol; ``reason`` is a short counter label."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _mechanism(description: Any):
    if not isinstance(description, dict) or len(description) > 16:
        raise Rejected("mechanism", "mechanism must be an object")
    try:
        key = describe_key(description)
    except TypeError:  # orjson refuses e.g. nesting deeper than 254 levels
        raise Rejected("mechanism", "mechanism is not a plain JSON object") from None
    mechanism = _MECHANISM_CACHE.get(key)
    if mechanism is None:
        try:
            mechanism = from_description(description)
        except (TypeError, ValueError) as exc:
            raise Rejected("mechanism", f"invalid mechanism: {exc}") from None
        if len(_MECHANISM_CACHE) > 4096:  # bounded: a hostile agent can't grow it forever
            _MECHANISM_CACHE.clear()
        _MECHANISM_CACHE[key] = mechanism
    return mechanism, key


def _number(message: dict, key: str) -> float:
    value = message[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Rejected("schema", f"{key} must be a finite number")
    return float(value)


def _codes(value: Any, n_cells: int, exact_types: bool) -> np.ndarray:
    """Codes as an int64 array; only genuine JSON integers in the grid pass.

    numpy converts a list of Python ints to int64 in C; floats, strings,
    nested lists or huge integers give another dtype or shape and are refused.
    JSON booleans are the one case numpy cannot tell from 0/1, so when the
    payload contains ``true``/``false`` anywhere (``exact_types``) the slow
    per-element check runs instead.
    """
    if not isinstance(value, list) or len(value) > MAX_CODES:
        raise Rejected("schema", "codes must be a list of at most 100000 integers")
    if not value:
        return np.empty(0, dtype=np.int64)
    if exact_types and not all(type(c) is int for c in value):
        raise Rejected("bad_code", "codes must be integers")
    try:
        codes = np.array(value)
    except (ValueError, OverflowError):  # ragged nesting or out of range
        raise Rejected("bad_code", "codes must be integers") from None
    if codes.dtype != np.int64 or codes.ndim != 1:
        raise Rejected("bad_code", "codes must be integers")
    if codes.min() < 0 or codes.max() >= n_cells:
        raise Rejected("bad_code", f"codes must be in [0, {n_cells - 1}]")
    return codes


@dataclass
class Report:
    agent: str
    channel: str
    kind: str
    seq: int
    t: float
    mechanism: dict
    key: str
    codes: Any  # array, or list of arrays (polar, vector)
    fields: list[str] | None = None
    strategy: dict | None = None


def parse_report(topic: str, payload: bytes, fleet: str) -> Report:
    """A valid report, or ``Rejected``.  Never raises anything else."""
    if len(payload) > MAX_PAYLOAD_BYTES:
        raise Rejected("oversized", f"payload of {len(payload)} bytes")
    levels = topic.split("/")
    if len(levels) != 5 or "/".join(levels[:3]) != f"{TOPIC_ROOT}/{fleet}":
        raise Rejected("topic", "not a report topic of this fleet")
    try:
        message = orjson.loads(payload)  # 3x faster than json on 500-code batches
    except orjson.JSONDecodeError:
        raise Rejected("json", "payload is not JSON") from None
    if not isinstance(message, dict):
        raise Rejected("json", "payload is not a JSON object")
    keys = set(message)
    if not REPORT_KEYS <= keys or not keys <= REPORT_KEYS | OPTIONAL_KEYS:
        raise Rejected("schema", "missing or unknown keys")
    if message["v"] != PROTOCOL_VERSION or isinstance(message["v"], bool):
        raise Rejected("version", f"protocol version {message['v']!r}")
    agent, channel = message["agent"], message["channel"]
    if not isinstance(agent, str) or not isinstance(channel, str) or not NAME.match(agent) \
            or not NAME.match(channel):
        raise Rejected("schema", "agent and channel must be names")
    if (agent, channel) != (levels[3], levels[4]):
        raise Rejected("spoofed", "agent or channel differs from the topic")
    seq = message["seq"]
    if type(seq) is not int or seq < 0:
        raise Rejected("schema", "seq must be a non-negative integer")
    t, dt = _number(message, "t"), _number(message, "dt")
    if dt < 0:
        raise Rejected("schema", "dt must be >= 0")
    kind = message["kind"]
    mechanism, key = _mechanism(message["mechanism"])
    exact = b"true" in payload or b"false" in payload
    codes = message["codes"]
    fields = message.get("fields")
    strategy = message.get("strategy")
    if kind in ("linear", "circular"):
        expected = "ogpm-circular" if kind == "circular" else None
        if (expected and mechanism.name != expected) or (
                not expected and mechanism.name in ("ogpm-circular", "ogpm-polar")):
            raise Rejected("kind", f"{kind} channel with mechanism {mechanism.name}")
        if fields is not None or strategy is not None:
            raise Rejected("schema", "fields/strategy are for vector channels")
        parsed = _codes(codes, mechanism.n_cells, exact)
    elif kind == "polar":
        if mechanism.name != "ogpm-polar" or fields is not None or strategy is not None:
            raise Rejected("kind", "polar channel needs mechanism ogpm-polar")
        if not isinstance(codes, list) or len(codes) != 2:
            raise Rejected("shape", "polar codes must be [radius codes, angle codes]")
        radius, angle = mechanism.components
        parsed = [_codes(codes[0], radius.n_cells, exact), _codes(codes[1], angle.n_cells, exact)]
        if parsed[0].size != parsed[1].size:
            raise Rejected("shape", "radius and angle code lists differ in length")
    elif kind == "vector":
        if mechanism.name in ("ogpm-circular", "ogpm-polar"):
            raise Rejected("kind", "vector channels use a linear mechanism")
        if not (isinstance(fields, list) and 2 <= len(fields) <= 64
                and all(isinstance(f, str) and NAME.match(f) for f in fields)
                and len(set(fields)) == len(fields)):
            raise Rejected("schema", "vector fields must be 2-64 distinct names")
        if not (isinstance(strategy, dict) and set(strategy) == {"k", "d", "epsilon"}
                and type(strategy["k"]) is int and type(strategy["d"]) is int
                and strategy["d"] == len(fields) and 1 <= strategy["k"] <= strategy["d"]
                and isinstance(strategy["epsilon"], (int, float))
                and not isinstance(strategy["epsilon"], bool)
                and math.isclose(strategy["epsilon"] / strategy["k"], mechanism.epsilon,
                                 rel_tol=1e-9)):
            raise Rejected("schema", "vector strategy must be {k, d, epsilon} matching fields")
        if not isinstance(codes, list) or len(codes) != len(fields):
            raise Rejected("shape", "vector codes need one list per field")
        parsed = [_codes(c, mechanism.n_cells, exact) for c in codes]
    else:
        raise Rejected("schema", f"unknown kind {kind!r}")
    return Report(agent, channel, kind, seq, t, message["mechanism"], key, parsed, fields,
                  strategy)


class SeqTracker:
    """Which sequence numbers of one (agent, channel) have been counted.

    Everything up to ``floor`` is seen; ``above`` holds the seen numbers past a
    gap (QoS 1 re-sends can arrive after newer messages).  A gap that stays
    open for ``max_pending`` later messages is given up on (the agent's spool
    may have dropped it), so memory stays bounded.
    """

    def __init__(self, max_pending: int = 10_000):
        self.floor = -1
        self.above: set[int] = set()
        self.max_pending = max_pending

    def seen(self, seq: int) -> bool:
        return seq <= self.floor or seq in self.above

    def add(self, seq: int) -> None:
        self.above.add(seq)
        while self.floor + 1 in self.above:
            self.floor += 1
            self.above.discard(self.floor)
        if len(self.above) > self.max_pending:
            self.floor = min(self.above)
            self.above.discard(self.floor)
            while self.floor + 1 in self.above:
                self.floor += 1
                self.above.discard(self.floor)


@dataclass
class AgentStats:
    messages: int = 0
    values: int = 0
    duplicates: int = 0
    rejects: int = 0
    last_seen: float | None = None
    online: bool | None = None  # from the retained status topic
    status: dict = field(default_factory=dict)


class Ingestor:
    """All aggregation state of a collector; picklable, mergeable across shards."""

    def __init__(self, *, fleet: str, bins: int = 50, window_seconds: float = 60.0,
                 keep_windows: int = 60):
        self.fleet = fleet
        self.bins, self.window_seconds, self.keep_windows = bins, window_seconds, keep_windows
        self.series: dict[str, dict[tuple, Series]] = {}  # channel -> identity -> series
        self.latest: dict[str, tuple] = {}  # channel -> identity of the newest series
        self.trackers: dict[tuple[str, str], SeqTracker] = {}
        self.agents: dict[str, AgentStats] = {}
        self.counters = collections.Counter()  # messages, values, duplicates
        self.rejects = collections.Counter()  # by reason
        self.dead_letters: collections.deque = collections.deque(maxlen=DEAD_LETTERS)

    # -- messages -------------------------------------------------------------------------
    def classify(self, topic: str) -> str:
        """'report', 'status', or 'ignore' (reserved levels, other fleets)."""
        levels = topic.split("/")
        if len(levels) < 4 or "/".join(levels[:2]) != TOPIC_ROOT or levels[2] != self.fleet:
            return "ignore"
        if levels[3].startswith("_"):
            return "ignore"  # collectors' own topics (aggregates, range runs)
        if len(levels) == 5 and levels[4] == "status":
            return "status"
        return "report"

    def ingest(self, topic: str, payload: bytes, now: float | None = None) -> str:
        """'accepted', 'duplicate', 'rejected:<reason>' or 'ignored'."""
        now = time.time() if now is None else now
        kind = self.classify(topic)
        if kind == "ignore":
            return "ignored"
        if kind == "status":
            return self._status(topic, payload, now)
        try:
            report = parse_report(topic, payload, self.fleet)
        except Rejected as rejection:
            return self._reject(topic, payload, rejection, now)
        except Exception as exc:  # defence in depth: no message may crash the collector
            return self._reject(topic, payload, Rejected("internal", type(exc).__name__), now)
        agent = self.agents.setdefault(report.agent, AgentStats())
        agent.last_seen = now
        tracker = self.trackers.setdefault((report.agent, report.channel), SeqTracker())
        if tracker.seen(report.seq):
            agent.duplicates += 1
            self.counters["duplicates"] += 1
            return "duplicate"
        series = self._series_for(report)
        values = series.update(agent=report.agent, t=report.t, codes=report.codes)
        tracker.add(report.seq)
        agent.messages += 1
        agent.values += values
        self.counters["messages"] += 1
        self.counters["values"] += values
        return "accepted"

    def _series_for(self, report: Report) -> Series:
        identity = series_identity(report.channel, report.kind, report.key, report.fields,
                                   report.strategy)
        by_identity = self.series.setdefault(report.channel, {})
        series = by_identity.get(identity)
        if series is None:
            series = by_identity[identity] = Series(
                channel=report.channel, kind=report.kind, mechanism=report.mechanism,
                bins=self.bins, window_seconds=self.window_seconds,
                keep_windows=self.keep_windows, fields=report.fields, strategy=report.strategy)
        self.latest[report.channel] = identity
        return series

    def _reject(self, topic: str, payload: bytes, rejection: Rejected, now: float) -> str:
        self.rejects[rejection.reason] += 1
        levels = topic.split("/")
        if len(levels) == 5:
            stats = self.agents.get(levels[3])
            if stats is not None:  # only agents that have sent valid data get an entry
                stats.rejects += 1
        self.dead_letters.append({"t": now, "topic": topic[:256], "reason": rejection.reason,
                                  "detail": rejection.detail[:200],
                                  "payload": payload[:256].decode("utf-8", "replace")})
        return f"rejected:{rejection.reason}"

    def _status(self, topic: str, payload: bytes, now: float) -> str:
        agent_id = topic.split("/")[3]
        if not NAME.match(agent_id) or len(payload) > 64 * 1024:
            return self._reject(topic, payload, Rejected("status", "bad status"), now)
        try:
            message = orjson.loads(payload) if payload else {}
        except orjson.JSONDecodeError:
            return self._reject(topic, payload, Rejected("status", "status is not JSON"), now)
        if not isinstance(message, dict) or message.get("state") not in ("online", "offline"):
            if payload:  # an empty retained message clears a status: not an error
                return self._reject(topic, payload, Rejected("status", "bad state"), now)
        stats = self.agents.setdefault(agent_id, AgentStats())
        stats.online = isinstance(message, dict) and message.get("state") == "online"
        stats.status = {k: message[k] for k in ("state", "budget", "t") if k in message} \
            if isinstance(message, dict) else {}
        return "status"

    # -- merging shards -----------------------------------------------------------------------
    def merge(self, other: "Ingestor") -> "Ingestor":
        """Combine another collector's state (disjoint message sets, e.g. shards)."""
        for channel, by_identity in other.series.items():
            mine = self.series.setdefault(channel, {})
            for identity, series in by_identity.items():
                if identity in mine:
                    mine[identity].merge(series)
                else:
                    mine[identity] = _copy(series)
        for channel, identity in other.latest.items():
            self.latest.setdefault(channel, identity)
        for name, stats in other.agents.items():
            mine = self.agents.setdefault(name, AgentStats())
            mine.messages += stats.messages
            mine.values += stats.values
            mine.duplicates += stats.duplicates
            mine.rejects += stats.rejects
            mine.last_seen = max(filter(None, (mine.last_seen, stats.last_seen)), default=None)
            if stats.online is not None:
                mine.online, mine.status = stats.online, stats.status
        self.counters.update(other.counters)
        self.rejects.update(other.rejects)
        return self


def _copy(series: Series) -> Series:
    import pickle

    return pickle.loads(pickle.dumps(series))
