"""Validating and aggregating report messages (no I/O here; see ``service.py``).

``Ingestor.ingest(topic, payload)`` checks one message against the protocol
(docs/PROTOCOL.md, docs/protocol.schema.json), drops duplicates by
(agent, channel, seq), and adds the codes to the channel's series.  A message
that fails any check is rejected, counted by reason and kept (truncated) in a
bounded dead-letter log; it changes no aggregate.  Checks are written by hand
rather than with a JSON-schema library so that a message costs microseconds;
tests keep them in agreement with the schema file.

The whole ``Ingestor`` pickles: it is the collector's checkpoint.  What a
shard publishes for the merge view is ``to_state()`` instead: JSON values
only, validated by ``from_state()`` (docs/SCALE_OUT.md).

A shard on a shared subscription (``claims`` set, see ``collector.shards``)
holds each new report until the other shards have seen its claim on the
(agent, channel, seq), so that a copy delivered to another shard is counted
once fleet-wide; ``settle()`` applies or drops what is held.
"""

from __future__ import annotations

import collections
import contextlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from edge_agent.mechanisms import from_description
from edge_agent.protocol import NAME, PROTOCOL_VERSION, TOPIC_ROOT, kind_problem

from .series import Series, describe_key, series_identity
from .stats import StateError, state_float, state_int, state_list

MAX_PAYLOAD_BYTES = 1 << 20  # far above a 500-value batch (~4 kB)
MAX_CODES = 100_000
MAX_SPAN = 1 << 17  # sequence numbers a tracker spans before giving up on old gaps (16 kB)
DEAD_LETTERS = 200
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
    problem = kind_problem(kind, mechanism, fields, strategy)
    if problem is not None:
        raise Rejected(*problem)
    if kind in ("linear", "circular"):
        parsed = _codes(codes, mechanism.n_cells, exact)
    elif kind == "polar":
        if not isinstance(codes, list) or len(codes) != 2:
            raise Rejected("shape", "polar codes must be [radius codes, angle codes]")
        radius, angle = mechanism.components
        parsed = [_codes(codes[0], radius.n_cells, exact), _codes(codes[1], angle.n_cells, exact)]
        if parsed[0].size != parsed[1].size:
            raise Rejected("shape", "radius and angle code lists differ in length")
    else:  # vector
        if not isinstance(codes, list) or len(codes) != len(fields):
            raise Rejected("shape", "vector codes need one list per field")
        parsed = [_codes(c, mechanism.n_cells, exact) for c in codes]
    return Report(agent, channel, kind, seq, t, message["mechanism"], key, parsed, fields,
                  strategy)


class SeqTracker:
    """Which sequence numbers of one (agent, channel) have been counted.

    ``floor``: every number up to it was counted here.  Numbers past a gap
    (QoS 1 re-sends can arrive after newer ones; a shard sees only its share)
    are bits of ``bits``: bit i stands for ``base + 1 + i``.  A bitmap keeps
    memory at one bit per number whatever the gaps: a shard's tracker is
    about two thirds gaps.  Once the numbers span more than ``MAX_SPAN``, the
    oldest gaps are given up on (the agent's spool may have dropped them):
    numbers up to ``skipped`` then count as seen here, so a late copy of one
    is dropped.  The give-up is local: ``counted`` (what a shard tells its
    peers it has) never includes it.
    """

    def __init__(self):
        self.floor = -1
        self.skipped = -1
        self.bits = 0

    def __setstate__(self, state: dict) -> None:
        if "above" in state:  # a checkpoint from before the bitmap: floor + a set
            above = state.pop("above")
            state.pop("max_pending", None)
            state["bits"] = sum(1 << (seq - state["floor"] - 1) for seq in above)
            state["skipped"] = -1
        self.__dict__.update(state)

    @property
    def base(self) -> int:
        return max(self.floor, self.skipped)

    def seen(self, seq: int) -> bool:
        base = self.base
        return seq <= base or (self.bits >> (seq - base - 1)) & 1 == 1

    def counted(self, seq: int) -> bool:
        """Seen and not merely given up on."""
        return seq <= self.floor or (seq > self.skipped and self.seen(seq))

    def add(self, seq: int) -> None:
        base = self.base
        if seq <= base:
            return
        self.bits |= 1 << (seq - base - 1)
        if self.bits & 1:
            self._fold()
        if self.bits.bit_length() > MAX_SPAN:
            # Give up on the oldest eighth of the span at once (amortised shifting).
            shift = MAX_SPAN // 8
            self.skipped = self.base + shift
            self.bits >>= shift
            self._fold()

    def _fold(self) -> None:
        """Leading seen numbers join ``floor`` or, past a give-up, ``skipped``."""
        ones = ((self.bits ^ (self.bits + 1)).bit_length() - 1)  # trailing one bits
        if ones:
            self.bits >>= ones
            if self.floor >= self.skipped:
                self.floor += ones
            else:
                self.skipped += ones


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
        self.latest_at: dict[str, float] = {}  # channel -> when ``latest`` was last reported
        self.trackers: dict[tuple[str, str], SeqTracker] = {}
        self.agents: dict[str, AgentStats] = {}
        self.counters = collections.Counter()  # messages, values, duplicates
        self.rejects = collections.Counter()  # by reason
        self.dead_letters: collections.deque = collections.deque(maxlen=DEAD_LETTERS)
        self.claims = None  # a shard's collector.shards.ClaimBook
        self._batch: dict[int, tuple[Series, list]] | None = None  # see batch()

    @classmethod
    def from_settings(cls, fleet: str, settings: dict) -> "Ingestor":
        """An empty ingestor with the aggregates ``settings`` of a shard state."""
        return cls(fleet=fleet, bins=settings["bins"], window_seconds=settings["window_seconds"],
                   keep_windows=settings["keep_windows"])

    def settings(self) -> dict:
        return {"bins": self.bins, "window_seconds": self.window_seconds,
                "keep_windows": self.keep_windows}

    def __getstate__(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "_batch"}

    def __setstate__(self, state: dict) -> None:
        # Checkpoints written before shards existed lack the newer attributes.
        self.__dict__.update({"latest_at": {}, "claims": None, **state, "_batch": None})

    @contextlib.contextmanager
    def batch(self):
        """Messages ingested inside are checked, deduplicated and counted one by one
        as always, but their codes reach the statistics together at the end, one
        summary per series and window (``Series.update_many``): most of a
        message's aggregation cost is numpy's fixed cost per call."""
        if self._batch is not None:  # already batching
            yield
            return
        self._batch = {}
        try:
            yield
        finally:
            batch, self._batch = self._batch, None
            for series, messages in batch.values():
                series.update_many(messages)

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
        """'accepted', 'duplicate', 'rejected:<reason>', 'ignored', 'status', or for a
        shard 'held' (applied or dropped later by ``settle``)."""
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
        if tracker.seen(report.seq) or (
                self.claims is not None and self.claims.is_held(report)):
            return self._duplicate(report)
        if self.claims is not None:
            self.claims.hold(report, now)
            return "held"
        self._accept(report, now)
        return "accepted"

    def settle(self, now_monotonic: float | None = None) -> tuple[int, int]:
        """A shard: apply held reports no other shard counts, drop the others.

        Returns (applied, dropped)."""
        if self.claims is None:
            return 0, 0
        accepted, dropped = self.claims.settle(self.trackers, now_monotonic)
        for report, received in accepted:
            self._accept(report, received)
        for report in dropped:
            self._duplicate(report)
        return len(accepted), len(dropped)

    def _duplicate(self, report: Report) -> str:
        self.agents.setdefault(report.agent, AgentStats()).duplicates += 1
        self.counters["duplicates"] += 1
        return "duplicate"

    def _accept(self, report: Report, now: float) -> None:
        series = self._series_for(report, now)
        if self._batch is None:
            values = series.update(agent=report.agent, t=report.t, codes=report.codes)
        else:
            values = series.values_in(report.codes)
            self._batch.setdefault(id(series), (series, []))[1].append(
                (report.agent, report.t, report.codes))
        self.trackers.setdefault((report.agent, report.channel), SeqTracker()).add(report.seq)
        if self.claims is not None:
            self.claims.accepted(report)
        agent = self.agents.setdefault(report.agent, AgentStats())
        agent.messages += 1
        agent.values += values
        self.counters["messages"] += 1
        self.counters["values"] += values

    def _series_for(self, report: Report, now: float) -> Series:
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
        self.latest_at[report.channel] = now
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
        """Combine another collector's state (disjoint message sets, e.g. shards).

        A channel's newest series is the one reported most recently on either
        side; dead letters keep the most recent of both."""
        for channel, by_identity in other.series.items():
            mine = self.series.setdefault(channel, {})
            for identity, series in by_identity.items():
                if identity in mine:
                    mine[identity].merge(series)
                else:
                    mine[identity] = _copy(series)
        for channel, identity in other.latest.items():
            at = other.latest_at.get(channel, -math.inf)
            if channel not in self.latest or at > self.latest_at.get(channel, -math.inf):
                self.latest[channel] = identity
                self.latest_at[channel] = at
        for name, stats in other.agents.items():
            mine = self.agents.setdefault(name, AgentStats())
            mine.messages += stats.messages
            mine.values += stats.values
            mine.duplicates += stats.duplicates
            mine.rejects += stats.rejects
            mine.last_seen = max(filter(None, (mine.last_seen, stats.last_seen)), default=None)
            # The newest status wins, whatever the merge order: a retired shard's frozen
            # state must not override what the live shards heard since.
            if stats.online is not None and (
                    mine.online is None or _status_time(stats) >= _status_time(mine)):
                mine.online, mine.status = stats.online, stats.status
        self.counters.update(other.counters)
        self.rejects.update(other.rejects)
        if other.dead_letters:
            letters = sorted([*self.dead_letters, *other.dead_letters], key=lambda d: d["t"])
            self.dead_letters.clear()
            self.dead_letters.extend(letters)  # the deque keeps the newest DEAD_LETTERS
        return self

    # -- serialised state (shards -> merge view, docs/SCALE_OUT.md) ----------------------------
    def to_state(self) -> dict:
        """Everything the merge view needs, as JSON values (no sequence trackers, nothing
        held): aggregates, counters, per-agent counters, newest series, dead letters."""
        series, index = [], {}
        for by_identity in self.series.values():
            for identity, one in by_identity.items():
                index[identity] = len(series)
                series.append(one.to_state())
        return {
            "fleet": self.fleet,
            "settings": self.settings(),
            "counters": {key: self.counters[key] for key in COUNTERS},
            "rejects": dict(self.rejects),
            "agents": {name: {"messages": a.messages, "values": a.values,
                              "duplicates": a.duplicates, "rejects": a.rejects,
                              "last_seen": a.last_seen, "online": a.online, "status": a.status}
                       for name, a in self.agents.items()},
            "series": series,
            "latest": {channel: [index[identity], self.latest_at.get(channel)]
                       for channel, identity in self.latest.items()},
            "dead_letters": list(self.dead_letters),
        }

    @classmethod
    def from_state(cls, state) -> "Ingestor":
        """An ingestor from ``to_state()`` output, or ``StateError`` saying what is wrong.

        Besides types and ranges it checks that the counters add up: the
        messages and values of all series, of all agents and the totals agree."""
        keys = {"fleet", "settings", "counters", "rejects", "agents", "series", "latest",
                "dead_letters"}
        if not isinstance(state, dict) or set(state) != keys:
            raise StateError(f"state: expected the keys {sorted(keys)}")
        fleet, settings = state["fleet"], state["settings"]
        if not isinstance(fleet, str) or not NAME.match(fleet):
            raise StateError("fleet: not a fleet name")
        if not isinstance(settings, dict) or set(settings) != {"bins", "window_seconds",
                                                               "keep_windows"}:
            raise StateError("settings: expected bins, window_seconds, keep_windows")
        bins = state_int(settings["bins"], "settings.bins")
        keep = state_int(settings["keep_windows"], "settings.keep_windows")
        window = state_float(settings["window_seconds"], "settings.window_seconds")
        if not (4 <= bins <= 1000 and 1 <= keep <= 10_000 and window >= 1):
            raise StateError("settings: out of range")
        ingestor = cls(fleet=fleet, bins=bins, window_seconds=window, keep_windows=keep)
        counters = _int_map(state["counters"], "counters")
        if set(counters) != set(COUNTERS):
            raise StateError(f"counters: expected {list(COUNTERS)}")
        ingestor.counters.update(counters)
        ingestor.rejects.update(_int_map(state["rejects"], "rejects"))
        ingestor._load_agents(state["agents"])
        series_states = state["series"]
        if not isinstance(series_states, list):
            raise StateError("series: expected a list")
        loaded = []
        for i, series_state in enumerate(series_states):
            series = Series.from_state(series_state, bins=bins, window_seconds=window,
                                       keep_windows=keep, where=f"series[{i}]")
            by_identity = ingestor.series.setdefault(series.channel, {})
            if series.identity in by_identity:
                raise StateError(f"series[{i}]: the same series twice")
            by_identity[series.identity] = series
            loaded.append(series)
        latest = state["latest"]
        if not isinstance(latest, dict) or set(latest) != set(ingestor.series):
            raise StateError("latest: expected one entry per channel")
        for channel, entry in latest.items():
            i, at = state_list(entry, 2, f"latest.{channel}")
            if type(i) is not int or not 0 <= i < len(loaded) or loaded[i].channel != channel:
                raise StateError(f"latest.{channel}: not a series of the channel")
            ingestor.latest[channel] = loaded[i].identity
            if at is not None:
                ingestor.latest_at[channel] = state_float(at, f"latest.{channel}[1]")
        letters = state["dead_letters"]
        if not isinstance(letters, list) or len(letters) > DEAD_LETTERS or not all(
                isinstance(d, dict) and set(d) == DEAD_LETTER_KEYS
                and isinstance(d["t"], (int, float)) and not isinstance(d["t"], bool)
                and math.isfinite(d["t"])
                and all(isinstance(d[k], str) and len(d[k]) <= 1024 for k in DEAD_LETTER_KEYS
                        if k != "t") for d in letters):
            raise StateError(f"dead_letters: expected at most {DEAD_LETTERS} dead letters")
        ingestor.dead_letters.extend(letters)
        ingestor._check_totals(loaded)
        return ingestor

    def _load_agents(self, agents) -> None:
        if not isinstance(agents, dict):
            raise StateError("agents: expected an object")
        for name, entry in agents.items():
            where = f"agents.{name[:64]}"
            if not NAME.match(name) or not isinstance(entry, dict) or set(entry) != AGENT_KEYS:
                raise StateError(f"{where}: expected an agent name and {sorted(AGENT_KEYS)}")
            stats = self.agents[name] = AgentStats(
                **{k: state_int(entry[k], f"{where}.{k}")
                   for k in ("messages", "values", "duplicates", "rejects")})
            if entry["last_seen"] is not None:
                stats.last_seen = state_float(entry["last_seen"], f"{where}.last_seen")
            if entry["online"] not in (None, True, False) or not isinstance(entry["status"], dict):
                raise StateError(f"{where}: online must be true, false or null, status an object")
            stats.online, stats.status = entry["online"], entry["status"]

    def _check_totals(self, series: list[Series]) -> None:
        messages, values = self.counters["messages"], self.counters["values"]
        checks = {"series messages": sum(s.messages for s in series),
                  "series values": sum(s.count() for s in series),
                  "agents' messages": sum(a.messages for a in self.agents.values()),
                  "agents' values": sum(a.values for a in self.agents.values())}
        for what, total in checks.items():
            expected = messages if "messages" in what else values
            if total != expected:
                raise StateError(f"counters: {what} add up to {total}, the counters say "
                                 f"{expected}")


COUNTERS = ("messages", "values", "duplicates")
AGENT_KEYS = {"messages", "values", "duplicates", "rejects", "last_seen", "online", "status"}
DEAD_LETTER_KEYS = {"t", "topic", "reason", "detail", "payload"}


def _int_map(value, where: str) -> dict[str, int]:
    if not isinstance(value, dict) or len(value) > 256:
        raise StateError(f"{where}: expected an object of counts")
    # Names only: reject reasons become Prometheus label values (views.py).
    if not all(isinstance(k, str) and NAME.match(k) for k in value):
        raise StateError(f"{where}: keys must be names of 1-64 letters, digits, '.', '_', '-'")
    return {k: state_int(v, f"{where}.{k}") for k, v in value.items()}


def _status_time(stats: AgentStats) -> float:
    """When the agent published its status (its own clock), else -inf."""
    t = stats.status.get("t")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) \
        and math.isfinite(t) else -math.inf


def _copy(series: Series) -> Series:
    import pickle

    return pickle.loads(pickle.dumps(series))
