"""A hostile corpus: 2,000+ messages of 40 kinds a collector must refuse, bound or ignore.

Each message says what must become of it (``expect``):

* ``rejected:<reason>``: counted under that reason, nothing else changes;
* ``ignored``: not the collector's (other fleets, collectors' own topics);
* ``dropped``: larger than the maximum packet size the collector asks of the broker,
  so the broker never sends it;
* ``accepted``, ``duplicate``, ``status``: valid messages of the registered but
  misbehaving device ``mallory`` (its own channels only) and of the registered
  ``idle-*`` and ``bulk-*`` devices that push the limits;
* ``range:<reason>``: a range result the collector does not show.

The corpus never impersonates a fleet device with a fresh sequence number: only the
broker's ACL can stop that (configs/mosquitto.acl), so it is out of the collector's
hands.  Replays of a device's genuine messages are in (``replays``, built from what
the fleet sent).

The collector under test runs with ``LIMITS`` and ``REGISTRY``; the corpus is built
for a fleet reporting on ``FLEET_CHANNELS`` before it arrives.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from edge_agent import protocol
from edge_agent.mechanisms import CircularOGPM, ClassicalOGPM
from edge_agent.mechanisms.categorical import GeneralizedRR

FLEET = "demo"
FLEET_AGENTS = [f"w-{i}" for i in range(4)]
FLEET_CHANNELS = {
    "ax": {"name": "ax", "source": "imu", "field": "accel_x", "kind": "linear",
           "epsilon": 1.0, "domain": [-2.0, 2.0]},
    "roll": {"name": "roll", "source": "imu", "field": "roll", "kind": "circular",
             "epsilon": 1.0},
}
IDLE = [f"idle-{i}" for i in range(20)]  # registered: statuses only
BULK = [f"bulk-{i}" for i in range(40)]  # registered: one report each
REGISTRY = [*FLEET_AGENTS, "mallory", *IDLE, *BULK]
LIMITS = {"agents": 32, "channels": 12, "series_per_channel": 4, "statuses": 8,
          "range_results": 2, "future_seconds": 300, "max_age_seconds": 86_400,
          "categories": 16}
COORDINATOR = "edge-collector-range"  # the configured [range_discovery] client_id

LINEAR = ClassicalOGPM(epsilon=1.0, low=-2.0, high=2.0)
CIRCULAR = CircularOGPM(epsilon=1.0)
MAX_PACKET = protocol.MAX_REPORT_BYTES + (64 << 10)  # collector.service.PACKET_OVERHEAD_BYTES


@dataclass(frozen=True)
class Hostile:
    kind: str
    topic: str
    payload: bytes
    expect: str
    retain: bool = False


def report_dict(agent: str, channel: str, seq: int, t: float, *, mechanism=LINEAR,
                kind: str | None = None, codes=(1, 2, 3)) -> dict:
    kind = kind or ("categorical" if hasattr(mechanism, "categories") else "linear")
    return json.loads(protocol.report(agent=agent, channel=channel, kind=kind, seq=seq, t=t,
                                      dt=1.0, mechanism=mechanism.describe(),
                                      codes=list(codes)))


def dumps(message) -> bytes:
    return json.dumps(message, separators=(",", ":")).encode()


def build(now: float, replays: list[tuple[str, bytes]], seed: int = 12) -> list[Hostile]:
    """The corpus for a collector whose clock reads about ``now``; ``replays``: genuine
    fleet reports (topic, payload) already counted."""
    rng = np.random.default_rng(seed)
    corpus: list[Hostile] = []

    def add(kind, topic, payload, expect, retain=False):
        payload = payload if isinstance(payload, bytes) else dumps(payload)
        corpus.append(Hostile(kind, topic, payload, expect, retain))

    victim = FLEET_AGENTS[0]
    victim_topic = protocol.data_topic(FLEET, victim, "ax")
    good = report_dict(victim, "ax", 10**9, now)  # a fresh seq: never sent as itself

    def variant(**changes):
        message = dict(good)
        for key, value in changes.items():
            if value is ...:
                message.pop(key)
            else:
                message[key] = value
        return message

    # -- malformed payloads on a fleet device's topic ------------------------------------
    for _ in range(300):
        cut = int(rng.integers(1, len(dumps(good)) - 1))
        add("truncated JSON", victim_topic, dumps(good)[:cut], "rejected:json")
    for _ in range(350):
        add("random bytes", victim_topic, bytes(rng.integers(0, 256, 64, dtype=np.uint8)) +
            b"\xff", "rejected:json")
    add("non-UTF-8 inside a string", victim_topic,
        dumps(good).replace(b'"ax"', b'"a\xffx"'), "rejected:json")
    add("UTF-16", victim_topic, json.dumps(good).encode("utf-16"), "rejected:json")
    for depth in (50, 500, 5000, 100_000):
        add("deep nesting", victim_topic, b"[" * depth + b"]" * depth, "rejected:json")
        add("deep nesting in a field", victim_topic,
            dumps(good).replace(b'"codes":[1,2,3]', b'"codes":' + b"[" * depth + b"]" * depth),
            "rejected:bad_code")
    for token in (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999"):
        add("NaN and Infinity", victim_topic,
            dumps(good).replace(b'"dt":1.0', b'"dt":' + token),
            "rejected:json" if b"Inf" in token or b"NaN" in token else "rejected:schema")
        add("NaN and Infinity in the mechanism", victim_topic,
            dumps(good).replace(b'"epsilon":1.0', b'"epsilon":' + token),
            "rejected:json" if b"Inf" in token or b"NaN" in token else "rejected:mechanism")
    for top in (b"[]", b"[1,2]", b"3", b'"report"', b"null", b"true", b""):
        add("not an object", victim_topic, top, "rejected:json")
    add("duplicate keys", victim_topic, dumps(good)[:-1] + b',"agent":"w-1"}', "rejected:spoofed")

    # -- wrong types and missing or extra fields -------------------------------------------
    for field, value in (("seq", "7"), ("seq", 1.5), ("t", "now"), ("dt", -1.0),
                         ("kind", "histogram"), ("agent", 5), ("channel", None),
                         ("codes", "1,2,3"), ("codes", {"0": 1}), ("fields", ["x"]),
                         ("mechanism", "ogpm"), ("strategy", {"k": 1})):
        for _ in range(10):
            add("wrong type", victim_topic, variant(**{field: value}),
                "rejected:mechanism" if field == "mechanism" else "rejected:schema")
    for field in ("v", "agent", "channel", "kind", "seq", "t", "dt", "mechanism", "codes"):
        add("missing field", victim_topic, variant(**{field: ...}),
            "rejected:schema")
    for _ in range(50):
        add("unknown field", victim_topic, variant(raw=[0.5, 0.7]), "rejected:schema")
    for version in (0, 2, "1", None):
        add("another protocol version", victim_topic, variant(v=version), "rejected:version")

    # -- out of range: sequence numbers, codes, names --------------------------------------
    for seq in (2**53, 2**63, 2**64 + 5, 10**30, -1):
        add("sequence number out of range", victim_topic, variant(seq=seq), "rejected:schema")
    for codes in ([70000], [1, 2, 65536], [-1], [2**63]):
        add("codes outside the grid", victim_topic, variant(codes=codes),
            "rejected:bad_code" if codes != [2**63] else "rejected:bad_code")
    add("too many codes", victim_topic, variant(codes=[1] * (protocol.MAX_CODES + 1)),
        "rejected:schema")
    add("a name too long", victim_topic, variant(channel="a" * 65), "rejected:schema")
    add("a name with a slash", victim_topic, variant(channel="a/b"), "rejected:schema")
    for mechanism in ({"name": "laplace", "epsilon": 1.0},
                      {**good["mechanism"], "epsilon": 0.0},
                      {**good["mechanism"], "low": 2.0, "high": -2.0},
                      {**good["mechanism"], "grid_bits": 40},
                      {**good["mechanism"], "epsilon": 1e300}):
        add("impossible mechanism", victim_topic, variant(mechanism=mechanism),
            "rejected:mechanism")
    add("kind against mechanism", victim_topic, variant(kind="circular"), "rejected:kind")
    add("polar codes of another shape", victim_topic,
        variant(kind="polar", codes=[[1, 2], [3]]), "rejected:kind")

    # -- categorical reports that break the protocol ------------------------------------------
    grr = {"name": "grr", "epsilon": 1.0, "categories": 3, "labels": ["rest", "walk", "run"]}
    olh = {**grr, "name": "olh"}
    oue = {**grr, "name": "oue"}
    for changes, reason in (
            ({"mechanism": grr, "kind": "linear"}, "kind"),
            ({"kind": "categorical"}, "kind"),  # a linear mechanism
            ({"mechanism": grr, "kind": "categorical", "codes": [0, 3]}, "bad_code"),
            ({"mechanism": grr, "kind": "categorical", "seeds": [1, 2, 3]}, "schema"),
            ({"mechanism": olh, "kind": "categorical", "codes": [0, 1]}, "schema"),
            ({"mechanism": olh, "kind": "categorical", "codes": [0, 1], "seeds": [5]}, "shape"),
            ({"mechanism": olh, "kind": "categorical", "codes": [0], "seeds": [2**32]},
             "bad_code"),
            ({"mechanism": olh, "kind": "categorical", "codes": [0, 9], "seeds": [1, 2]},
             "bad_code"),
            ({"mechanism": oue, "kind": "categorical", "codes": [[0, 0]]}, "bad_code"),
            ({"mechanism": oue, "kind": "categorical", "codes": [[2, 1]]}, "bad_code"),
            ({"mechanism": oue, "kind": "categorical", "codes": [[0, 3]]}, "bad_code"),
            ({"mechanism": oue, "kind": "categorical", "codes": [0, 1]}, "shape"),
            ({"mechanism": {**grr, "labels": ["rest", "walk"]}, "kind": "categorical"},
             "mechanism"),
            ({"mechanism": {**grr, "labels": ["rest", "walk", "walk"]}, "kind": "categorical"},
             "mechanism"),
            ({"mechanism": {**grr, "labels": ["rest", "walk", "r\nun"]}, "kind": "categorical"},
             "mechanism"),
            ({"mechanism": {**grr, "labels": ["rest", "walk", "r" * 41]}, "kind": "categorical"},
             "mechanism"),
            ({"mechanism": {**grr, "categories": 70_000, "labels": None}, "kind": "categorical"},
             "mechanism"),
            ({"mechanism": {**grr, "delta": 0.5}, "kind": "categorical"}, "mechanism"),
            ({"mechanism": {**oue, "categories": 5000, "labels": None}, "kind": "categorical",
              "codes": [[0]]}, "mechanism")):  # unary: at most 1024 bits per value
        add("bad categorical report", victim_topic, variant(**{"codes": [0, 1], **changes}),
            f"rejected:{reason}")

    # -- spoofing: the payload names another device than the topic -------------------------
    for agent in FLEET_AGENTS[1:]:
        for _ in range(30):
            add("spoofed agent", victim_topic, variant(agent=agent), "rejected:spoofed")
        add("spoofed channel", protocol.data_topic(FLEET, agent, "roll"),
            report_dict(agent, "ax", 10**9, now), "rejected:spoofed")

    # -- sizes ------------------------------------------------------------------------------
    add("oversized payload", victim_topic,
        dumps(good)[:-1] + b',"pad":"' + b"x" * protocol.MAX_REPORT_BYTES + b'"}',
        "rejected:oversized")
    for _ in range(2):
        add("payload beyond the maximum packet", victim_topic, b"x" * (MAX_PACKET + 1024),
            "dropped")

    # -- replays of genuine messages, also retained ------------------------------------------
    for i, (topic, payload) in enumerate(replays):
        add("replay", topic, payload, "duplicate")
        if i < 20:
            add("retained replay", topic, payload, "duplicate", retain=True)

    # -- topics that are not reports of this fleet --------------------------------------------
    for topic, expect in ((f"ldp/v1/{FLEET}/{victim}/ax/extra", "rejected:topic"),
                          (f"ldp/v1/{FLEET}/{victim}", "rejected:topic"),
                          (f"ldp/v1/{FLEET}/_agent/ax", "ignored"),  # a collectors' level
                          (f"ldp/v1/{FLEET}/{victim}/_ax", "rejected:spoofed")):
        add("malformed report topic", topic, good, expect)
    for topic in (f"ldp/v1/other/{victim}/ax", "ldp/v2/demo/w-0/ax", "elsewhere"):
        add("another fleet or root", topic, good, "ignored")
    for topic in (protocol.aggregates_topic(FLEET, "ax"), protocol.confirm_topic(FLEET, victim),
                  protocol.range_control_topic(FLEET, "r1"),
                  protocol.range_reply_topic(FLEET, victim, "r1")):
        add("collectors' reserved topics", topic, b'{"v":1}',
            "rejected:topic" if topic.endswith("/_range/r1") else "ignored", retain=True)

    # -- statuses ---------------------------------------------------------------------------------
    status_topic = protocol.status_topic(FLEET, victim)
    genuine_status = json.loads(protocol.status(agent=victim, state="online", t=now))
    for payload in (b"{", b"[]", dumps({**genuine_status, "agent": "w-1"}),
                    dumps({**genuine_status, "state": "hijacked"}),
                    dumps({**genuine_status, "budget": {"epsilon": -1}}),
                    dumps({**genuine_status, "extra": 1}),
                    dumps({**genuine_status, "channels": {f"c{i}": {} for i in range(200)}}),
                    b'{"v":1,"agent":"w-0","state":"online","pad":"' + b"x" * 60_000 + b'"}'):
        for _ in range(5):
            add("bad status", status_topic, payload, "rejected:status", retain=True)
    add("status of an unregistered agent", protocol.status_topic(FLEET, "eve"),
        protocol.status(agent="eve", state="online", t=now), "rejected:unknown_agent")
    for i, agent in enumerate(IDLE):
        add("status flood", protocol.status_topic(FLEET, agent),
            protocol.status(agent=agent, state="online", t=now),
            "status" if i < LIMITS["statuses"] else "rejected:limit_statuses")

    # -- unregistered agents, with perfectly valid reports ---------------------------------------
    for i in range(400):
        agent = f"eve-{i}"
        add("unregistered agent", protocol.data_topic(FLEET, agent, "ax"),
            report_dict(agent, "ax", 0, now), "rejected:unknown_agent")

    # -- the registered, misbehaving device: its own channels only --------------------------------
    def mallory(channel, seq, *, t=now, mechanism=LINEAR, expect="accepted", kind="bounds"):
        add(kind, protocol.data_topic(FLEET, "mallory", channel),
            report_dict("mallory", channel, seq, t, mechanism=mechanism), expect)

    mallory("m", 0, kind="a valid report")
    for seq in (2**52, 2**33, 1, protocol.SEQ_LIMIT - 1, 131_072 + 7, 2):
        mallory("m", seq, kind="sequence jumps")
    for seq in (2**52, 1, 0):
        mallory("m", seq, kind="sequence jumps", expect="duplicate")
    for seq in range(2000, 2000 + 40, 2):  # every other number: 20 gaps in its tracker
        mallory("m", seq, kind="gaps")
    for i in range(61):
        mallory("m", 5000 + i, t=now + 86_400 * (i + 1), kind="dated ahead",
                expect="rejected:future")
    for i in range(10):
        mallory("m", 6000 + i, t=now - 86_400 * (i + 2), kind="dated long ago",
                expect="rejected:stale")
    mallory("m", 5000, t=now + 86_400, kind="dated ahead", expect="duplicate")  # settled
    for i in range(100):  # each epsilon or domain change starts a series
        series_limit = LIMITS["series_per_channel"]
        # (i = 0 is the channel's series already)
        mallory("m", 7000 + i, mechanism=ClassicalOGPM(epsilon=1.0, low=-2.0 - i, high=2.0),
                kind="mechanism variants",
                expect="accepted" if i < series_limit else "rejected:limit_series")
    mallory("categories", 0, mechanism=GeneralizedRR(epsilon=1.0, categories=17),
            kind="too many categories", expect="rejected:limit_categories")
    room = LIMITS["channels"] - len(FLEET_CHANNELS) - 1  # ax, roll and m exist
    for i in range(300):
        mallory(f"m{i}", 0, kind="channel flood",
                expect="accepted" if i < room else "rejected:limit_channels")
    agents_before_bulk = len(FLEET_AGENTS) + 1 + LIMITS["statuses"]
    for i, agent in enumerate(BULK):
        add("agent flood (registered)", protocol.data_topic(FLEET, agent, "m"),
            report_dict(agent, "m", 0, now),
            "accepted" if i < LIMITS["agents"] - agents_before_bulk else "rejected:limit_agents")

    # -- range results: only the configured coordinator's, for at most range_results channels --
    def result(channel, side, expect, coordinator=COORDINATOR, topic_channel=None):
        message = protocol.RangeResult(v=1, run="r1", coordinator=coordinator, channel=channel,
                                       side=side, domain=(-2.0, 2.0), started_at=now,
                                       status="done", estimate=1.0)
        add("range result", protocol.range_result_topic(FLEET, topic_channel or channel, side),
            protocol.encode(message), expect, retain=True)

    result("ax", "max", "range:coordinator", coordinator="mallory")
    result("ax", "min", "range:topic", topic_channel="roll")
    for i in range(5):
        result(f"r{i}", "max", "range:shown" if i < LIMITS["range_results"]
               else "range:limit_range_results")
    add("range result", protocol.range_result_topic(FLEET, "ax", "min"), b"{oops",
        "range:json", retain=True)
    return corpus


def expected(corpus: list[Hostile], prefix: str) -> dict[str, int]:
    """How many messages of the corpus expect ``<prefix>:<reason>``, by reason."""
    counts: dict[str, int] = {}
    for entry in corpus:
        if entry.expect.startswith(prefix + ":"):
            reason = entry.expect.split(":", 1)[1]
            counts[reason] = counts.get(reason, 0) + 1
    return counts
