"""The hand-written report parser the typed protocol replaced, kept only as the baseline of
``benchmarks.bench_protocol`` (collector/aggregation/ingest.py ``parse_report`` and its
helpers as of commit 482e47e, with the mechanism cache of that version).  Not used by the
product."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np
import orjson

from edge_agent.mechanisms import from_description

NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
REPORT_KEYS = {"v", "agent", "channel", "kind", "seq", "t", "dt", "mechanism", "codes"}
OPTIONAL_KEYS = {"fields", "strategy"}
_MECHANISM_CACHE: dict[str, Any] = {}


class Rejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def _describe_key(description: dict) -> str:
    return orjson.dumps(description, option=orjson.OPT_SORT_KEYS).decode()


def _mechanism(description: Any):
    if not isinstance(description, dict) or len(description) > 16:
        raise Rejected("mechanism", "mechanism must be an object")
    try:
        key = _describe_key(description)
    except TypeError:
        raise Rejected("mechanism", "mechanism is not a plain JSON object") from None
    mechanism = _MECHANISM_CACHE.get(key)
    if mechanism is None:
        try:
            mechanism = from_description(description)
        except (TypeError, ValueError) as exc:
            raise Rejected("mechanism", f"invalid mechanism: {exc}") from None
        if len(_MECHANISM_CACHE) > 4096:
            _MECHANISM_CACHE.clear()
        _MECHANISM_CACHE[key] = mechanism
    return mechanism, key


def _number(message: dict, key: str) -> float:
    value = message[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise Rejected("schema", f"{key} must be a finite number")
    return float(value)


def _codes(value: Any, n_cells: int, exact_types: bool) -> np.ndarray:
    if not isinstance(value, list) or len(value) > 100_000:
        raise Rejected("schema", "codes must be a list of at most 100000 integers")
    if not value:
        return np.empty(0, dtype=np.int64)
    if exact_types and not all(type(c) is int for c in value):
        raise Rejected("bad_code", "codes must be integers")
    try:
        codes = np.array(value)
    except (ValueError, OverflowError):
        raise Rejected("bad_code", "codes must be integers") from None
    if codes.dtype != np.int64 or codes.ndim != 1:
        raise Rejected("bad_code", "codes must be integers")
    if codes.min() < 0 or codes.max() >= n_cells:
        raise Rejected("bad_code", f"codes must be in [0, {n_cells - 1}]")
    return codes


def _kind_problem(kind, mechanism, fields, strategy):
    if kind in ("linear", "circular"):
        expected = "ogpm-circular" if kind == "circular" else None
        if (expected and mechanism.name != expected) or (
                not expected and mechanism.name in ("ogpm-circular", "ogpm-polar")):
            return "kind", f"{kind} channel with mechanism {mechanism.name}"
        if fields is not None or strategy is not None:
            return "schema", "fields/strategy are for vector channels"
    elif kind == "polar":
        if mechanism.name != "ogpm-polar" or fields is not None or strategy is not None:
            return "kind", "polar channel needs mechanism ogpm-polar"
    elif kind == "vector":
        if mechanism.name in ("ogpm-circular", "ogpm-polar"):
            return "kind", "vector channels use a linear mechanism"
        if not (isinstance(fields, list) and 2 <= len(fields) <= 64
                and all(isinstance(f, str) and NAME.match(f) for f in fields)
                and len(set(fields)) == len(fields)):
            return "schema", "vector fields must be 2-64 distinct names"
        if not (isinstance(strategy, dict) and set(strategy) == {"k", "d", "epsilon"}
                and type(strategy["k"]) is int and type(strategy["d"]) is int
                and strategy["d"] == len(fields) and 1 <= strategy["k"] <= strategy["d"]
                and isinstance(strategy["epsilon"], (int, float))
                and not isinstance(strategy["epsilon"], bool)
                and math.isclose(strategy["epsilon"] / strategy["k"], mechanism.epsilon,
                                 rel_tol=1e-9)):
            return "schema", "vector strategy must be {k, d, epsilon} matching fields"
    else:
        return "schema", f"unknown kind {kind!r}"
    return None


def parse_report(topic: str, payload: bytes, fleet: str):
    if len(payload) > 1 << 20:
        raise Rejected("oversized", f"payload of {len(payload)} bytes")
    levels = topic.split("/")
    if len(levels) != 5 or "/".join(levels[:3]) != f"ldp/v1/{fleet}":
        raise Rejected("topic", "not a report topic of this fleet")
    try:
        message = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise Rejected("json", "payload is not JSON") from None
    if not isinstance(message, dict):
        raise Rejected("json", "payload is not a JSON object")
    keys = set(message)
    if not REPORT_KEYS <= keys or not keys <= REPORT_KEYS | OPTIONAL_KEYS:
        raise Rejected("schema", "missing or unknown keys")
    if message["v"] != 1 or isinstance(message["v"], bool):
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
    _number(message, "t")
    if _number(message, "dt") < 0:
        raise Rejected("schema", "dt must be >= 0")
    kind = message["kind"]
    mechanism, key = _mechanism(message["mechanism"])
    exact = b"true" in payload or b"false" in payload
    codes = message["codes"]
    fields, strategy = message.get("fields"), message.get("strategy")
    problem = _kind_problem(kind, mechanism, fields, strategy)
    if problem is not None:
        raise Rejected(*problem)
    if kind in ("linear", "circular"):
        return _codes(codes, mechanism.n_cells, exact)
    if kind == "polar":
        if not isinstance(codes, list) or len(codes) != 2:
            raise Rejected("shape", "polar codes must be [radius codes, angle codes]")
        radius, angle = mechanism.components
        parsed = [_codes(codes[0], radius.n_cells, exact), _codes(codes[1], angle.n_cells, exact)]
        if parsed[0].size != parsed[1].size:
            raise Rejected("shape", "radius and angle code lists differ in length")
        return parsed
    if not isinstance(codes, list) or len(codes) != len(fields):
        raise Rejected("shape", "vector codes need one list per field")
    return [_codes(c, mechanism.n_cells, exact) for c in codes]
