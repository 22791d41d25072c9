"""The MQTT wire protocol between agents and collectors (docs/PROTOCOL.md).

Topics
  ldp/v1/<fleet>/<agent>/<channel>   perturbed reports, QoS 1, JSON (``report``)
  ldp/v1/<fleet>/<agent>/status      retained agent status; last will ``offline``
  ldp/v1/<fleet>/_<anything>/...     reserved for collectors (aggregates, range runs)
  ldp/v1/<fleet>/_range/control/<run>          range-discovery announce/round/end (coordinator)
  ldp/v1/<fleet>/_range/result/<channel>/<side> retained range result (coordinator)
  ldp/v1/<fleet>/<agent>/_range/<run>          an agent's join and answers for one run

Payloads never contain a raw reading: only grid codes of perturbed values,
the parameters of the mechanism that produced them, and counts.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

PROTOCOL_VERSION = 1
TOPIC_ROOT = "ldp/v1"
STATUS = "status"
# Agents, channels, fields, fleets, shards.  \Z, not $: "$" also matches before a final
# newline.
NAME = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


def data_topic(fleet: str, agent: str, channel: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{agent}/{channel}"


def status_topic(fleet: str, agent: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{agent}/{STATUS}"


def data_subscription(fleet: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/+/+"


def encode(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode()


def report(*, agent: str, channel: str, kind: str, seq: int, t: float, dt: float,
           mechanism: dict[str, Any], codes: list, fields: list[str] | None = None,
           strategy: dict[str, Any] | None = None) -> bytes:
    """One message: a channel's perturbed reports for one batch.

    ``codes`` is a list of ints (linear, circular), two lists (polar: radius,
    angle) or one list per field (vector).  ``t`` is the batch start and
    ``dt`` its length, in seconds.
    """
    message: dict[str, Any] = {
        "v": PROTOCOL_VERSION, "agent": agent, "channel": channel, "kind": kind, "seq": seq,
        "t": round(t, 3), "dt": round(dt, 3), "mechanism": mechanism, "codes": codes,
    }
    if fields is not None:
        message["fields"] = fields
    if strategy is not None:
        message["strategy"] = strategy
    return encode(message)


def status(*, agent: str, state: str, t: float | None = None, **details: Any) -> bytes:
    message: dict[str, Any] = {"v": PROTOCOL_VERSION, "agent": agent, "state": state}
    if t is not None:
        message["t"] = round(t, 3)
    message.update(details)
    return encode(message)


# -- range discovery (docs/PROTOCOL.md, "Range discovery") ------------------------------
RANGE = "_range"


def range_control_topic(fleet: str, run: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{RANGE}/control/{run}"


def range_control_subscription(fleet: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{RANGE}/control/+"


def range_result_topic(fleet: str, channel: str, side: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{RANGE}/result/{channel}/{side}"


def range_result_subscription(fleet: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{RANGE}/result/+/+"


def range_reply_topic(fleet: str, agent: str, run: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/{agent}/{RANGE}/{run}"


def range_reply_subscription(fleet: str, run: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/+/{RANGE}/{run}"


def range_join(*, agent: str, run: str, accept: bool, reason: str | None = None) -> bytes:
    message: dict[str, Any] = {"v": PROTOCOL_VERSION, "type": "join", "agent": agent,
                               "run": run, "accept": accept}
    if reason is not None:
        message["reason"] = reason
    return encode(message)


def range_answer(*, agent: str, run: str, round: int, z: int) -> bytes:
    return encode({"v": PROTOCOL_VERSION, "type": "answer", "agent": agent, "run": run,
                   "round": round, "z": z})


def kind_problem(kind, mechanism, fields, strategy) -> tuple[str, str] | None:
    """Why a series identity is impossible, as (reason, detail), or None.

    ``mechanism`` is the built mechanism; the same rules hold for reports
    (``collector.ingest.parse_report``) and for series loaded from a shard state.
    """
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
