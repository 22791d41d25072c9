"""Scale-out: collector shards on one shared subscription, and the merge view.

See docs/SCALE_OUT.md for the topology and the failure modes.  Three parts:

* ``ClaimBook``: exactly-once counting across shards.  The broker gives each
  message to one shard, but a *copy* of a report (an agent re-sending its
  spool after a restart, a replay) is a new message and may go to another
  shard, whose own sequence tracker has never seen it.  So every shard holds
  each new report, publishes a claim on its (agent, channel, seq) on
  ``ldp/v1/<fleet>/_shards/<shard>/claims``, and applies it only once every
  live peer has answered with a claims message that saw that claim.  Two
  shards holding the same report keep it on the one whose name sorts first;
  a report another shard has already applied is dropped as a duplicate.
* ``encode_state`` / ``decode_state``: a shard's partial aggregates as
  versioned JSON, retained on ``ldp/v1/<fleet>/_shards/<shard>/state``.
  Nothing from the network is unpickled; every field is validated.
* ``MergeView`` and ``MergeService`` (``edge-collector merge``): the latest
  state of every shard, merged (``Ingestor.merge`` is exact), served through
  the same ``Views`` and ``WebServer`` as a single collector.
"""

from __future__ import annotations

import collections
import json
import logging
import math
import secrets
import signal
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import orjson

from edge_agent.protocol import NAME, TOPIC_ROOT, range_result_subscription

from .ingest import Ingestor, Report, SeqTracker
from .stats import StateError

log = logging.getLogger(__name__)

STATE_VERSION = 1
CLAIMS_VERSION = 2  # 1: durable floors and lists (replaced: a dead peer's gaps made them grow)
PEER_TIMEOUT = 5.0  # the default of [shard] peer_timeout_seconds
REPEATS = 2  # each applied number goes out in this many claims messages
MAX_STATE_BYTES = 64 << 20
MAX_CLAIMS_BYTES = 16 << 20
MAX_SEQS_PER_KEY = 100_000


def shard_topic(fleet: str, shard: str, what: str) -> str:
    """``ldp/v1/<fleet>/_shards/<shard>/<what>``, what = ``state`` or ``claims``."""
    return f"{TOPIC_ROOT}/{fleet}/_shards/{shard}/{what}"


def shard_of(topic: str, fleet: str, what: str) -> str | None:
    """The shard name of a ``_shards`` topic of this fleet, or None."""
    prefix, _, rest = topic.partition(f"{TOPIC_ROOT}/{fleet}/_shards/")
    name, _, tail = rest.partition("/")
    if prefix or tail != what or not NAME.match(name):
        return None
    return name


# -- exactly once across shards ---------------------------------------------------------------

@dataclass
class Held:
    report: Report
    received: float  # when the shard journaled it (wall clock)
    claimed_in: int | None = None  # the version of our first claims message naming it


@dataclass
class Peer:
    incarnation: str  # new at every start of the peer: its versions count from 1 again
    version: int
    seen: dict[str, tuple[str, int]]  # shard -> (incarnation, version) of its claims read
    pending: dict[tuple[str, str], set[int]]  # held there
    have: dict[tuple[str, str], set[int]]  # of the numbers its peers hold: counted there
    durable: int  # everything it announced as applied up to this version is checkpointed
    heard: float  # our monotonic clock when it last spoke live (-inf: only retained so far)
    t: float  # the peer's wall clock when it published
    # Announced as applied and not yet durable; collected over its messages.
    applied: dict[tuple[str, str], set[int]] = field(default_factory=dict)
    announced: collections.deque = field(default_factory=collections.deque)  # (version, key, seq)


class ClaimBook:
    """One shard's side of the claim exchange (module docstring, docs/SCALE_OUT.md).

    A claims message says, per (agent, channel):

    * ``held``: the sequence numbers held here, waiting for the peers' answers;
    * ``have``: of the numbers the peers hold, those this shard has counted
      (its tracker's ``counted``: never a give-up);
    * ``applied``: newly applied here, each in ``REPEATS`` messages.

    and once, ``durable``: the newest version whose ``applied`` numbers are
    all in a checkpoint written to disk.  Peers collect a shard's applied
    numbers and refrain from counting them.  Once durable they record them
    in their trackers, so that a copy arriving while this shard is dead is
    still dropped.  Before that they must not: a crash undoes what was not
    checkpointed (the journal replay holds it again), and a peer that had
    recorded it would make the restarted shard drop it.

    No list grows with history: a list of everything past a gap would grow for
    as long as a dead peer's share is missing.

    A shard applies a held report once every live peer has answered a claims
    message naming it (its ``seen`` shows our version) and none has it;
    two holders keep it on the one whose name sorts first.  No floor is ever
    sent: a tracker's give-up is local, and a peer told to skip a gap would
    drop the reports its broker session still holds for it.

    Pickled with the ``Ingestor`` (it holds reports not yet applied); the rest
    is per incarnation: the peers' claims come again.
    """

    def __init__(self, shard: str, group: str, *, peer_timeout: float = PEER_TIMEOUT):
        self.held: dict[tuple[str, str, int], Held] = {}
        self.configure(shard, group, peer_timeout=peer_timeout)

    def configure(self, shard: str, group: str, *, peer_timeout: float,
                  clock: Callable[[], float] = time.monotonic) -> None:
        """Start an incarnation: after construction and after a restore."""
        self.shard, self.group = shard, group
        self.peer_timeout = peer_timeout
        self.clock = clock
        # Versions count from 1 in each incarnation: no wall clock, which can step back.
        self.incarnation = secrets.token_hex(8)
        self.version = 0
        self.durable = 0
        self.peers: dict[str, Peer] = {}
        self.rejected = collections.Counter()
        # (first version, key, seq) to announce as applied; what a restore brings back is
        # in the checkpoint already, so it is never announced (peers need not wait on it).
        self.news: collections.deque = collections.deque()
        for held in self.held.values():  # claims of an earlier incarnation were never answered
            held.claimed_in = None
        self.restart_grace()

    def restart_grace(self) -> None:
        """Apply nothing until live peers had time to speak (call when subscribed)."""
        self.grace_until = self.clock() + self.peer_timeout

    def __getstate__(self) -> dict:
        return {"shard": self.shard, "group": self.group, "held": self.held}

    def __setstate__(self, state: dict) -> None:
        self.held = state["held"]
        self.configure(state["shard"], state["group"], peer_timeout=PEER_TIMEOUT)

    # -- the ingestor's side --
    def is_held(self, report: Report) -> bool:
        return (report.agent, report.channel, report.seq) in self.held

    def hold(self, report: Report, received: float) -> None:
        self.held[(report.agent, report.channel, report.seq)] = Held(report, received)

    def accepted(self, report: Report) -> None:
        self.news.append((self.version + 1, (report.agent, report.channel), report.seq))

    def _answered(self, peer: Peer, version: int) -> bool:
        incarnation, seen = peer.seen.get(self.shard, ("", -1))
        return incarnation == self.incarnation and seen >= version

    def settle(self, trackers: dict[tuple[str, str], SeqTracker],
               now: float | None = None) -> tuple[list[tuple[Report, float]], list[Report]]:
        """Held reports to apply (with their arrival time) and to drop."""
        now = self.clock() if now is None else now
        live = [peer for peer in self.peers.values() if now - peer.heard <= self.peer_timeout]
        ready = now >= self.grace_until
        accept, drop = [], []
        for key3, held in list(self.held.items()):
            agent, channel, seq = key3
            key = (agent, channel)
            tracker = trackers.get(key)
            if (tracker is not None and tracker.seen(seq)) or any(
                    seq in peer.have.get(key, ()) or seq in peer.applied.get(key, ())
                    or (name < self.shard and seq in peer.pending.get(key, ()))
                    for name, peer in self.peers.items()):
                drop.append(held.report)  # counted elsewhere, or held by a shard first in order
            elif ready and held.claimed_in is not None and all(
                    self._answered(peer, held.claimed_in) for peer in live):
                accept.append((held.report, held.received))
            else:
                continue
            del self.held[key3]
        return accept, drop

    def held_since_before(self, t: float) -> bool:
        """Whether something received before ``t`` (e.g. replayed at a restart) is held."""
        return any(held.received < t for held in self.held.values())

    # -- checkpoints --
    def snapshot(self) -> int:
        """Taken with the checkpoint, under the same lock; ``promote`` it once written.

        Whatever our messages up to now announced as applied was applied before
        this moment, so it is in the checkpoint."""
        return self.version

    def promote(self, version: int) -> None:
        """The checkpoint taken at ``snapshot() == version`` is on disk."""
        self.durable = max(self.durable, version)

    # -- messages --
    def message(self, now: float, trackers: dict[tuple[str, str], SeqTracker]) -> bytes:
        """Our claims: [held, have, applied] per "agent/channel" (class docstring)."""
        self.version += 1
        keys: dict[tuple[str, str], tuple[list[int], ...]] = collections.defaultdict(
            lambda: ([], [], []))
        for (agent, channel, seq), held in self.held.items():
            if held.claimed_in is None:
                held.claimed_in = self.version
            keys[agent, channel][0].append(seq)
        for peer in self.peers.values():
            for key, seqs in peer.pending.items():
                tracker = trackers.get(key)
                if tracker is not None:
                    keys[key][1].extend(seq for seq in seqs if tracker.counted(seq))
        while self.news and self.news[0][0] <= self.version - REPEATS:
            self.news.popleft()
        for _, key, seq in self.news:
            keys[key][2].append(seq)
        return orjson.dumps({
            "v": CLAIMS_VERSION, "type": "claims", "shard": self.shard, "group": self.group,
            "t": now, "incarnation": self.incarnation, "version": self.version,
            "durable": self.durable,
            "seen": {name: [peer.incarnation, peer.version] for name, peer in self.peers.items()},
            "keys": {f"{agent}/{channel}": [sorted(set(part)) for part in parts]
                     for (agent, channel), parts in keys.items() if any(parts)}})

    def receive(self, name: str, payload: bytes, trackers: dict[tuple[str, str], SeqTracker],
                *, retained: bool = False) -> str:
        """A peer's claims: remember them, and record what it checkpointed as seen.

        A retained message (delivered when we subscribe) tells what the peer last
        said, not that it is alive: only a live message makes it live."""
        if name == self.shard:
            return "own"
        try:
            parsed = self._parse(name, payload)
        except StateError as exc:
            self.rejected[str(exc).split(":", 1)[0]] += 1
            log.warning("claims of shard %s rejected: %s", name, exc)
            return "rejected"
        if parsed is None:
            return "other group"
        peer, applied = parsed
        known = self.peers.get(name)
        if known is not None and known.incarnation == peer.incarnation:
            if peer.version < known.version:
                return "stale"
            peer.applied, peer.announced = known.applied, known.announced
        # A new incarnation starts empty: what the old one had not checkpointed was undone.
        for key, seqs in applied.items():
            mine = peer.applied.setdefault(key, set())
            for seq in seqs - mine:
                mine.add(seq)
                peer.announced.append((peer.version, key, seq))
        while peer.announced and peer.announced[0][0] <= peer.durable:
            _, key, seq = peer.announced.popleft()
            trackers.setdefault(key, SeqTracker()).add(seq)
            mine = peer.applied.get(key)
            if mine is not None:
                mine.discard(seq)
                if not mine:
                    del peer.applied[key]
        if retained:
            peer.heard = known.heard if known is not None else -math.inf
        self.peers[name] = peer
        return "accepted"

    def _parse(self, name: str, payload: bytes):
        if len(payload) > MAX_CLAIMS_BYTES:
            raise StateError("oversized: claims message too large")
        try:
            message = orjson.loads(payload)
        except orjson.JSONDecodeError:
            raise StateError("json: claims are not JSON") from None
        keys = {"v", "type", "shard", "group", "t", "incarnation", "version", "durable", "seen",
                "keys"}
        if not isinstance(message, dict) or set(message) != keys \
                or message["v"] != CLAIMS_VERSION or message["type"] != "claims" \
                or message["shard"] != name:
            raise StateError(f"schema: expected a version {CLAIMS_VERSION} claims message of "
                             f"{name}")
        if message["group"] != self.group:
            return None
        incarnation, version, durable, seen, t = (
            message["incarnation"], message["version"], message["durable"], message["seen"],
            message["t"])
        if not (isinstance(incarnation, str) and 0 < len(incarnation) <= 64
                and type(version) is int and type(durable) is int and 0 <= durable < version
                and isinstance(seen, dict)
                and all(isinstance(k, str) and isinstance(v, list) and len(v) == 2
                        and isinstance(v[0], str) and type(v[1]) is int
                        for k, v in seen.items())):
            raise StateError("schema: incarnation, version, durable and seen are malformed")
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t):
            raise StateError("schema: t must be a finite number")
        if not isinstance(message["keys"], dict):
            raise StateError("schema: keys must be an object")
        parts = ({}, {}, {})  # held, have, applied
        for text, entry in message["keys"].items():
            agent, _, channel = text.partition("/")
            if not (NAME.match(agent) and NAME.match(channel) and isinstance(entry, list)
                    and len(entry) == len(parts)
                    and all(isinstance(part, list) and len(part) <= MAX_SEQS_PER_KEY
                            and all(type(s) is int and s >= 0 for s in part)
                            for part in entry)):
                raise StateError(f"schema: bad claims entry {text[:140]!r}")
            for into, seqs in zip(parts, entry):
                if seqs:
                    into[agent, channel] = set(seqs)
        pending, have, applied = parts
        peer = Peer(incarnation, version, {k: (v[0], v[1]) for k, v in seen.items()},
                    pending, have, durable, self.clock(), float(t))
        return peer, applied

    def peers_json(self) -> dict:
        """What the claim exchange looks like from here (for the API)."""
        mono = self.clock()
        return {"held": len(self.held),
                "peers": {name: {"t": peer.t, "heard_seconds_ago": mono - peer.heard
                                 if math.isfinite(peer.heard) else None,
                                 "live": mono - peer.heard <= self.peer_timeout,
                                 "held": sum(len(s) for s in peer.pending.values())}
                          for name, peer in sorted(self.peers.items())},
                "rejected": dict(self.rejected)}


# -- the state a shard publishes ---------------------------------------------------------------

def encode_state(state: dict, *, shard: str, group: str | None, every: float,
                 now: float) -> bytes:
    """The versioned JSON document of docs/SCALE_OUT.md ("Shard state") around an
    ``Ingestor.to_state()``: a copy, so it can be encoded outside the ingest lock."""
    document = {"v": STATE_VERSION, "type": "shard-state", "shard": shard, "group": group,
                "t": now, "every": every, "state": state}
    # The standard library keeps integers exact at any size (orjson stops at 64 bits).
    return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


class ShardStateRejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def decode_state(payload: bytes, *, shard: str, fleet: str, settings: dict,
                 group: str | None = None) -> tuple[dict, Ingestor]:
    """(envelope without the state, the shard's ``Ingestor``) or ``ShardStateRejected``."""
    if len(payload) > MAX_STATE_BYTES:
        raise ShardStateRejected("oversized", f"{len(payload)} bytes")
    try:
        document = json.loads(payload, parse_constant=_no_constant)
    except (ValueError, RecursionError) as exc:  # also: integers beyond 4300 digits
        raise ShardStateRejected("json", str(exc)[:200]) from None
    keys = {"v", "type", "shard", "group", "t", "every", "state"}
    if not isinstance(document, dict) or set(document) != keys:
        raise ShardStateRejected("schema", f"expected the keys {sorted(keys)}")
    if document["v"] != STATE_VERSION or document["type"] != "shard-state":
        raise ShardStateRejected("version", f"state version {str(document['v'])[:20]}")
    if document["shard"] != shard:
        raise ShardStateRejected("topic", "the shard name differs from the topic's")
    if group is not None and document["group"] != group:
        raise ShardStateRejected("group", f"shard of group {str(document['group'])[:64]!r}")
    for key in ("t", "every"):
        value = document[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) \
                or not math.isfinite(value) or value < 0:
            raise ShardStateRejected("schema", f"{key} must be a finite number >= 0")
    state = document.pop("state")
    if not isinstance(state, dict) or state.get("fleet") != fleet:
        raise ShardStateRejected("fleet", f"not a state of fleet {fleet!r}")
    if state.get("settings") != settings:
        raise ShardStateRejected("settings", f"aggregates settings {state.get('settings')!r}"
                                             f" differ from ours {settings!r}"[:300])
    try:
        return document, Ingestor.from_state(state)
    except StateError as exc:
        raise ShardStateRejected("schema", str(exc)[:300]) from None
    except (RecursionError, MemoryError, OverflowError, TypeError, ValueError,
            AttributeError, KeyError, IndexError) as exc:
        raise ShardStateRejected("schema", f"{type(exc).__name__}: {str(exc)[:200]}") from None


def _no_constant(name: str):
    raise ValueError(f"{name} is not JSON")


@dataclass
class ShardEntry:
    ingestor: Ingestor
    t: float
    every: float
    received: float
    size: int
    group: str | None


@dataclass
class MergeView:
    """The latest valid state of each shard, merged on demand (cached)."""

    fleet: str
    settings: dict
    group: str | None = None  # only shards of this group; None: any
    exclude: str | None = None  # a shard serving the merged view merges itself live
    clock: Callable[[], float] = time.time
    shards: dict[str, ShardEntry] = field(default_factory=dict)
    rejects: collections.Counter = field(default_factory=collections.Counter)
    errors: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        self._lock = threading.RLock()
        self._generation = 0
        self._cache: tuple[int, Ingestor] | None = None

    def update(self, topic: str, payload: bytes) -> str:
        """A message on ``_shards/+/state``: 'accepted', 'removed', 'ignored' or
        'rejected:<reason>'.  Never raises: a bad payload keeps the shard's last state."""
        name = shard_of(topic, self.fleet, "state")
        if name is None or name == self.exclude:
            return "ignored"
        if not payload:  # an operator cleared the retained state: forget the shard
            with self._lock:
                if self.shards.pop(name, None) is not None:
                    log.warning("shard %s removed (its retained state was cleared)", name)
                    self._generation += 1
            return "removed"
        try:
            envelope, ingestor = decode_state(payload, shard=name, fleet=self.fleet,
                                              settings=self.settings, group=self.group)
        except ShardStateRejected as exc:
            return self._reject(name, exc.reason, exc.detail)
        except Exception as exc:  # defence in depth: the merge view must not die of a payload
            return self._reject(name, "internal", type(exc).__name__)
        with self._lock:
            known = self.shards.get(name)
            if known is not None and envelope["t"] < known.t:
                return self._reject(name, "stale", "older than the state we hold")
            self.shards[name] = ShardEntry(ingestor, envelope["t"], envelope["every"],
                                           self.clock(), len(payload), envelope["group"])
            self.errors.pop(name, None)
            self._generation += 1
        return "accepted"

    def _reject(self, name: str, reason: str, detail: str) -> str:
        with self._lock:
            self.rejects[reason] += 1
            self.errors[name] = f"{reason}: {detail}"[:300]
        log.warning("state of shard %s rejected (%s): %s", name, reason, detail[:300])
        return f"rejected:{reason}"

    def ingestor(self, local: Ingestor | None = None) -> Ingestor:
        """All shards merged (plus ``local``, a live ingestor, merged fresh each call)."""
        with self._lock:
            generation, entries = self._generation, sorted(self.shards.items())
            cache = self._cache
        if cache is None or cache[0] != generation:
            merged = Ingestor.from_settings(self.fleet, self.settings)
            for _, entry in entries:
                merged.merge(entry.ingestor)
            cache = (generation, merged)
            with self._lock:
                if self._generation == generation:
                    self._cache = cache
        if local is None:
            return cache[1]
        return Ingestor.from_settings(self.fleet, self.settings).merge(local).merge(cache[1])

    def shards_json(self, local: dict | None = None) -> dict:
        """``shards`` and ``shard_rejects`` for /api/channels (docs/API.md)."""
        now = self.clock()
        with self._lock:
            shards = {name: {"t": e.t, "age": max(0.0, now - e.t), "received": e.received,
                             "stale": now - e.t > 3 * e.every + 5, "group": e.group,
                             "messages": e.ingestor.counters["messages"],
                             "values": e.ingestor.counters["values"],
                             "duplicates": e.ingestor.counters["duplicates"],
                             "bytes": e.size, "error": self.errors.get(name)}
                      for name, e in self.shards.items()}
            for name, error in self.errors.items():
                shards.setdefault(name, {"t": None, "age": None, "received": None,
                                         "stale": True, "group": None, "messages": 0,
                                         "values": 0, "duplicates": 0, "bytes": 0,
                                         "error": error})
            rejects = dict(self.rejects)
        if local is not None:
            shards.update(local)
        return {"shards": dict(sorted(shards.items())), "shard_rejects": rejects}


# -- edge-collector merge ------------------------------------------------------------------------

class MergeService:
    """Subscribes to every shard's retained state and serves the merged aggregates.

    Stateless: a restart gets every shard's latest state again (retained)."""

    def __init__(self, config, *, web: bool = True):
        from .range import new_client
        from .service import on_range_result, settings_of
        from .views import Views

        self.config = config
        self.lock = threading.RLock()
        self.view = MergeView(config.fleet, settings_of(config), group=config.broker.shared_group)
        self.range_results: dict[str, dict[str, dict]] = {}
        self._connected_since: float | None = None
        self.views = Views(self.view.ingestor, self.lock, broker_status=self._broker,
                           range_results=lambda: self.range_results,
                           extra=self.view.shards_json)
        broker = config.broker
        self.client = new_client(broker, f"{broker.client_id}-merge")
        self.client.reconnect_delay_set(min_delay=1, max_delay=30)
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        states = shard_topic(config.fleet, "+", "state")
        self.client.message_callback_add(states, lambda c, u, m: self.view.update(m.topic,
                                                                                 m.payload))
        self.client.message_callback_add(range_result_subscription(config.fleet),
                                         lambda c, u, m: on_range_result(self.range_results, m))
        self._stop = threading.Event()
        self.web = None
        if web:
            from .web import WebServer

            self.web = WebServer(self.views, host=config.http.host, port=config.http.port,
                                 push_seconds=config.http.push_seconds)

    def _broker(self) -> dict:
        return {"connected": self.client.is_connected(), "since": self._connected_since}

    def _on_connect(self, client, userdata, flags, reason_code, properties=None):
        if reason_code.is_failure:
            log.error("broker refused the merge view: %s", reason_code)
            return
        self._connected_since = time.time()
        client.subscribe([(shard_topic(self.config.fleet, "+", "state"), 1),
                          (range_result_subscription(self.config.fleet), 1)])

    def _on_disconnect(self, client, userdata, flags, reason_code, properties=None):
        self._connected_since = time.time()
        if not self._stop.is_set():
            log.warning("merge view disconnected from the broker: %s", reason_code)

    def start(self) -> None:
        broker = self.config.broker
        self.client.connect_async(broker.host, broker.port, broker.keepalive)
        self.client.loop_start()
        if self.web is not None:
            self.web.start()
        self._thread = threading.Thread(target=self._snapshots, name="merge-snapshots",
                                        daemon=True)
        self._thread.start()

    def _snapshots(self) -> None:
        """The merged aggregates as the retained snapshots a single collector publishes
        (shards do not publish partial ones)."""
        from .service import publish_snapshots

        every = self.config.snapshots.interval_seconds
        while every and not self._stop.wait(every):
            try:
                if self.client.is_connected() and self.view.shards:
                    publish_snapshots(self.client, self.views, self.config.fleet)
            except Exception:
                log.exception("publishing merged snapshots failed")

    def stop(self) -> None:
        self._stop.set()
        if self.web is not None:
            self.web.stop()
        self.client.disconnect()
        self.client.loop_stop()

    def run_forever(self) -> int:
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        self.start()
        try:
            while not stop.wait(0.5):
                pass
        finally:
            self.stop()
        return 0


__all__: list[Any] = ["ClaimBook", "MergeService", "MergeView", "decode_state", "encode_state",
                      "shard_topic"]
