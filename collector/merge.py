"""The merge view: the shards' published states, merged (``edge-collector merge``).

Each shard retains its partial aggregates on ``ldp/v1/<fleet>/_shards/<shard>/state``
(typed: ``edge_agent.protocol.states.ShardState``; docs/SCALE_OUT.md).
``MergeView`` keeps the latest valid state of each shard and merges them on
demand (``Ingestor.merge`` is exact); ``MergeService`` serves the result through
the same ``Views`` and ``WebServer`` as a single collector.  Nothing is unpickled:
a state is decoded through its types and checked for sums no reports could give.
"""

from __future__ import annotations

import collections
import logging
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edge_agent import protocol
from edge_agent.protocol import Rejected
from edge_agent.protocol.states import (
    AggregateSettings,
    IngestorState,
    decode_partition_state,
    decode_shard_state,
)

from .config import CollectorConfig
from .ingest import Ingestor
from .publisher import CollectorClient
from .range import RangeResults
from .scaleout.feed import PartitionFeed
from .stats import StateError
from .views import Views
from .web import WebServer, latest_channels

log = logging.getLogger(__name__)


class ShardStateRejected(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def decode_state(payload: bytes, *, shard: str, fleet: str, settings: AggregateSettings,
                 group: str | None = None) -> tuple[dict, Ingestor]:
    """(envelope without the state, the shard's ``Ingestor``) or ``ShardStateRejected``."""
    try:
        document = decode_shard_state(payload, shard)
    except Rejected as exc:
        raise ShardStateRejected(exc.reason, exc.detail) from None
    if group is not None and document.group != group:
        raise ShardStateRejected("group", f"shard of group {document.group!r}")
    envelope = {"v": document.v, "type": document.type, "shard": document.shard,
                "group": document.group, "t": document.t, "every": document.every}
    return envelope, _ingestor(document.state, fleet, settings)


def decode_partition(payload: bytes, *, partition: int, fleet: str,
                     settings: AggregateSettings) -> tuple[dict, Ingestor]:
    """(envelope, the partition's ``Ingestor``) of a scale-out partition state
    (docs/SCALE_OUT.md), or ``ShardStateRejected``."""
    try:
        document = decode_partition_state(payload, partition)
    except Rejected as exc:
        raise ShardStateRejected(exc.reason, exc.detail) from None
    envelope = {"v": document.v, "type": document.type, "t": document.t,
                "every": document.every, "group": None, "owner": document.owner,
                "sequence": document.sequence}
    return envelope, _ingestor(document.state, fleet, settings)


def _ingestor(state: IngestorState, fleet: str, settings: AggregateSettings) -> Ingestor:
    if state.fleet != fleet:
        raise ShardStateRejected("fleet", f"not a state of fleet {fleet!r}")
    if state.settings != settings:
        raise ShardStateRejected("settings", f"aggregates settings {state.settings} "
                                             f"differ from ours {settings}"[:300])
    try:
        return Ingestor.from_state(state)
    except StateError as exc:
        raise ShardStateRejected("schema", str(exc)[:300]) from None
    except (RecursionError, MemoryError, OverflowError, TypeError, ValueError,
            AttributeError, KeyError, IndexError) as exc:
        raise ShardStateRejected("schema", f"{type(exc).__name__}: {str(exc)[:200]}") from None


@dataclass
class ShardEntry:
    ingestor: Ingestor
    t: float
    every: float
    received: float
    size: int
    group: str | None
    owner: str | None = None  # a scale-out partition's member


@dataclass
class MergeView:
    """The latest valid state of each shard, merged on demand (cached)."""

    fleet: str
    settings: AggregateSettings
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

    def update_partition(self, key: str, payload: bytes) -> str:
        """A scale-out partition's state (key ``p.<n>`` of the state bucket), as ``update``."""
        prefix, _, number = key.partition(".")
        if prefix != "p" or not number.isdigit() or len(number) > 4:
            return "ignored"
        name = f"p{int(number):04d}"
        return self._put(name, payload, lambda: decode_partition(
            payload, partition=int(number), fleet=self.fleet, settings=self.settings))

    def update(self, topic: str, payload: bytes) -> str:
        """A message on ``_shards/+/state``: 'accepted', 'removed', 'ignored' or
        'rejected:<reason>'.  Never raises: a bad payload keeps the shard's last state."""
        name = protocol.shard_of(topic, self.fleet, "state")
        if name is None or name == self.exclude:
            return "ignored"
        return self._put(name, payload, lambda: decode_state(
            payload, shard=name, fleet=self.fleet, settings=self.settings, group=self.group))

    def _put(self, name: str, payload: bytes, decode: Callable[[], tuple[dict, Ingestor]]) \
            -> str:
        if not payload:  # an operator cleared the retained state: forget the shard
            with self._lock:
                if self.shards.pop(name, None) is not None:
                    log.warning("shard %s removed (its retained state was cleared)", name)
                    self._generation += 1
            return "removed"
        try:
            envelope, ingestor = decode()
        except ShardStateRejected as exc:
            return self._reject(name, exc.reason, exc.detail)
        except Exception as exc:  # defence in depth: the merge view must not die of a payload
            return self._reject(name, "internal", type(exc).__name__)
        with self._lock:
            known = self.shards.get(name)
            # (A partition's states arrive in the bucket's revision order: no clock needed.)
            if known is not None and "sequence" not in envelope and envelope["t"] < known.t:
                return self._reject(name, "stale", "older than the state we hold")
            self.shards[name] = ShardEntry(ingestor, envelope["t"], envelope["every"],
                                           self.clock(), len(payload), envelope["group"],
                                           envelope.get("owner"))
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
                             "owner": e.owner,
                             "messages": e.ingestor.counters["messages"],
                             "values": e.ingestor.counters["values"],
                             "duplicates": e.ingestor.counters["duplicates"],
                             "bytes": e.size, "error": self.errors.get(name)}
                      for name, e in self.shards.items()}
            for name, error in self.errors.items():
                shards.setdefault(name, {"t": None, "age": None, "received": None,
                                         "stale": True, "group": None, "owner": None,
                                         "messages": 0,
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

    def __init__(self, config: CollectorConfig, *, web: bool = True):
        self.config = config
        self.lock = threading.RLock()
        self.view = MergeView(config.fleet, config.aggregate_settings,
                              group=config.broker.shared_group)
        self.range_results = RangeResults(
            config.fleet, coordinator=config.range_discovery.client_id,
            limit=config.limits.range_results)
        follow = {protocol.range_result_subscription(config.fleet):
                  self.range_results.on_message}
        self.feed = None
        if config.scale_out is not None:  # the partitions' states, from the KV bucket
            self.feed = PartitionFeed(config.scale_out, self.view.update_partition,
                                      name=f"{config.broker.client_id}-merge")
        else:
            follow[protocol.shard_topic(config.fleet, "+", "state")] = \
                lambda c, u, m: self.view.update(m.topic, m.payload)
        self.client = CollectorClient(config, role="merge", label="merge view", follow=follow)
        self.views = Views(self.view.ingestor, self.lock, broker_status=self.client.status,
                           range_results=self.range_results.get,
                           range_ignored=self.range_results.ignored_counts,
                           extra=self.view.shards_json)
        self._stop = threading.Event()
        self.web = None
        if web:
            self.web = WebServer.from_config(self.views, config.http)

    def start(self) -> None:
        self.client.start()
        if self.feed is not None:
            self.feed.start()
        if self.web is not None:
            self.web.start()
        self._thread = threading.Thread(target=self._snapshots, name="merge-snapshots",
                                        daemon=True)
        self._thread.start()

    def _snapshots(self) -> None:
        """The merged aggregates as the retained snapshots a single collector publishes
        (shards do not publish partial ones)."""
        every = self.config.snapshots.interval_seconds
        while every and not self._stop.wait(every):
            try:
                if self.client.connected and self.view.shards:
                    self.client.publish_snapshots(latest_channels(self.web, self.views))
            except Exception:
                log.exception("publishing merged snapshots failed")

    def stop(self) -> None:
        self._stop.set()
        if self.feed is not None:
            self.feed.stop()
        if self.web is not None:
            self.web.stop()
        self.client.stop()

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
