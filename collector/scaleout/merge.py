"""The merge view: the scale-out partitions' states, merged (``edge-collector merge``).

Each partition's owner writes its aggregates to key ``p.<n>`` of the NATS KV
bucket ``<stream>_state`` (typed: ``collector.storage.states.PartitionState``;
docs/guides/SCALE_OUT.md), which ``scaleout.feed.PartitionFeed`` watches.
``MergeView`` keeps the latest valid state of each partition and merges them on
demand (``Ingestor.merge`` is exact); ``MergeService`` serves the result through
the same serving front as a single collector (``collector.front``).  Nothing is unpickled:
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

from collector.aggregation.ingest import Ingestor
from collector.config import CollectorConfig
from collector.front import ServingFront
from collector.results.backends import open_results_store
from collector.results.recorder import MergedResultsRecorder
from collector.scaleout.feed import PartitionFeed
from collector.scaleout.partition_state import (
    PartitionStateRejected,
    decode_partition,
    partition_of_key,
)
from collector.storage.states import AggregateSettings

log = logging.getLogger(__name__)


@dataclass
class PartitionEntry:
    ingestor: Ingestor
    t: float
    every: float
    received: float
    size: int
    owner: str  # the member that wrote it


@dataclass
class MergeView:
    """The latest valid state of each partition, merged on demand (cached)."""

    fleet: str
    settings: AggregateSettings
    clock: Callable[[], float] = time.time
    partitions: dict[str, PartitionEntry] = field(default_factory=dict)
    rejects: collections.Counter = field(default_factory=collections.Counter)
    errors: dict[str, str] = field(default_factory=dict)

    def __post_init__(self):
        self._lock = threading.RLock()
        self._generation = 0
        self._cache: tuple[int, Ingestor] | None = None

    def update_partition(self, key: str, payload: bytes) -> str:
        """A partition's state (key ``p.<n>`` of the state bucket): 'accepted', 'removed',
        'ignored' or 'rejected:<reason>'.  Never raises: a bad payload keeps the
        partition's last state.  (States arrive in the bucket's revision order: no clock
        decides which is newer.)"""
        number = partition_of_key(key)
        if number is None:
            return "ignored"
        name = f"p{number:04d}"
        if not payload:  # an empty value: forget the partition
            with self._lock:
                if self.partitions.pop(name, None) is not None:
                    log.warning("partition %s removed (its state was emptied)", name)
                    self._generation += 1
            return "removed"
        try:
            document, ingestor = decode_partition(payload, partition=number,
                                                  fleet=self.fleet, settings=self.settings)
        except PartitionStateRejected as exc:
            return self._reject(name, exc.reason, exc.detail)
        except Exception as exc:  # defence in depth: the merge view must not die of a payload
            return self._reject(name, "internal", type(exc).__name__)
        with self._lock:
            self.partitions[name] = PartitionEntry(ingestor, document.t, document.every,
                                                   self.clock(), len(payload), document.owner)
            self.errors.pop(name, None)
            self._generation += 1
        return "accepted"

    def reject_partition(self, key: str, reason: str, detail: str) -> None:
        """A value of key ``p.<n>`` refused before its state was read (a reference to an
        object that is not that partition's state)."""
        number = partition_of_key(key)
        if number is not None:
            self._reject(f"p{number:04d}", reason, detail)

    def _reject(self, name: str, reason: str, detail: str) -> str:
        with self._lock:
            self.rejects[reason] += 1
            self.errors[name] = f"{reason}: {detail}"[:300]
        log.warning("state of partition %s rejected (%s): %s", name, reason, detail[:300])
        return f"rejected:{reason}"

    def ingestor(self) -> Ingestor:
        """All partitions merged."""
        with self._lock:
            generation, entries = self._generation, sorted(self.partitions.items())
            cache = self._cache
        if cache is None or cache[0] != generation:
            merged = Ingestor.from_settings(self.fleet, self.settings)
            for _, entry in entries:
                merged.merge(entry.ingestor)
            if cache is not None:  # what did not change need not be computed again
                merged.adopt(cache[1])
            cache = (generation, merged)
            with self._lock:
                if self._generation == generation:
                    self._cache = cache
        return cache[1]

    def partitions_json(self) -> dict:
        """``partitions`` and ``partition_rejects`` for /api/channels (docs/reference/API.md)."""
        now = self.clock()
        with self._lock:
            partitions = {
                name: {"owner": e.owner, "t": e.t, "age": max(0.0, now - e.t),
                       "received": e.received, "stale": now - e.t > 3 * e.every + 5,
                       "messages": e.ingestor.counters["messages"],
                       "values": e.ingestor.counters["values"],
                       "duplicates": e.ingestor.counters["duplicates"],
                       "bytes": e.size, "error": self.errors.get(name)}
                for name, e in self.partitions.items()}
            for name, error in self.errors.items():
                partitions.setdefault(name, {"owner": None, "t": None, "age": None,
                                             "received": None, "stale": True, "messages": 0,
                                             "values": 0, "duplicates": 0, "bytes": 0,
                                             "error": error})
            rejects = dict(self.rejects)
        return {"partitions": dict(sorted(partitions.items())), "partition_rejects": rejects}


# -- edge-collector merge ------------------------------------------------------------------------

class MergeService:
    """Watches every partition's state and serves the merged aggregates (``[scale_out]``)
    through the same serving front as a single collector (``collector.front``); members
    publish no partial snapshots.  Every closed window of the merged aggregates is written
    to the results store (``[results]``: PostgreSQL for a fleet this size), which history
    queries read.

    Stateless: a restart reads every partition's latest state again."""

    def __init__(self, config: CollectorConfig, *, web: bool = True):
        if config.scale_out is None:
            raise ValueError("scale_out: the merge view needs the [scale_out] table")
        self.config = config
        self.view = MergeView(config.fleet, config.aggregate_settings)
        self.results = open_results_store(config)
        self.recorder = MergedResultsRecorder(
            self.results, source=f"merge/{config.fleet}", aggregates=self.view.ingestor,
            grace=config.results.close_after_seconds, retention=config.retention())
        self.front = ServingFront(config, self.view.ingestor, threading.RLock(), role="merge",
                                  label="merge view", extra=self.view.partitions_json,
                                  web=web, results=self.results)
        if self.front.web is not None:
            self.front.web.register(self.recorder)
        self.feed = PartitionFeed(config.scale_out, self.view.update_partition,
                                  on_rejected=self.view.reject_partition,
                                  name=f"{config.broker.client_id}-merge")

    def start(self) -> None:
        self.front.start()
        self.feed.start()
        self.recorder.start()

    def stop(self) -> None:
        self.feed.stop()
        self.recorder.stop()
        self.front.stop()
        self.results.close()

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
