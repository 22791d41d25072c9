"""The serving front of a collector: everything it serves and publishes, the same for a
single collector (``collector.service``) and the scale-out merge view
(``collector.scaleout.merge``).

* ``range_results``: the retained range results it follows (``GET /api/range``);
* ``views``: the documents of its aggregates (``collector.api.documents.Views``);
* ``snapshots``: every document computed once per push period, outside the
  aggregates' lock (``collector.api.snapshots``), with the web server on;
* ``web``: the dashboard, API and metrics, served from the snapshots;
* ``client``: its own MQTT client (``collector.broker.publisher``), which follows
  the range results and publishes every channel's retained snapshot every
  ``[snapshots] interval_seconds``, from the latest snapshot.

The front reads the aggregates through ``aggregates()`` under ``lock`` and nothing
else: what feeds them (the journal, or the partitions' states) is its owner's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from collector.aggregation.ingest import Ingestor
from collector.api.documents import ESTIMATE_SHARE, Views
from collector.api.server import WebServer
from collector.api.snapshots import Snapshots
from collector.api.workers import EstimateWorkers, auto_workers
from collector.broker.publisher import CollectorClient
from collector.config import CollectorConfig
from collector.range.results import RangeResults
from collector.results.query import HistoryQuery
from collector.results.store import ResultsStore
from edge_agent import protocol

log = logging.getLogger(__name__)


class ServingFront:
    """``role`` and ``label`` name its MQTT client (``<client_id>-<role>``, and in logs);
    ``broker_status`` is what ``/api/channels`` says of the broker (default: this
    client's connection); ``extra`` adds top-level fields to ``/api/channels``;
    ``web=False``: no web server and no snapshot thread (the retained snapshots are then
    computed when published); ``results``: the results store history queries read."""

    def __init__(self, config: CollectorConfig, aggregates: Callable[[], Ingestor],
                 lock: threading.RLock, *, role: str, label: str,
                 clock: Callable[[], float] = time.time,
                 broker_status: Callable[[], dict] | None = None,
                 extra: Callable[[], dict] | None = None, web: bool = True,
                 results: ResultsStore | None = None):
        self.config = config
        self.range_results = RangeResults(
            config.fleet, coordinator=config.range_discovery.client_id,
            limit=config.limits.range_results)
        follow = {protocol.range_result_subscription(config.fleet): self.range_results.on_message}
        self.client = CollectorClient(config, role=role, label=label, follow=follow)
        workers = config.aggregates.estimate_workers
        if workers == "auto":
            workers = auto_workers()
        self.views = Views(aggregates, lock, clock,
                           broker_status=broker_status or self.client.status,
                           range_results=self.range_results.get,
                           range_ignored=self.range_results.ignored_counts, extra=extra,
                           budget_seconds=ESTIMATE_SHARE * config.http.push_seconds,
                           workers=EstimateWorkers(workers) if workers and web else None)
        self.snapshots = self.web = None
        if web:
            self.snapshots = Snapshots(self.views, push_seconds=config.http.push_seconds)
            history = None if results is None else HistoryQuery(results,
                                                                 config.aggregates.spans)
            self.web = WebServer.from_config(self.snapshots, config.http, history)
        self._stop = threading.Event()
        self._publisher: threading.Thread | None = None

    @property
    def connected(self) -> bool:
        """Whether its MQTT client is connected (retained snapshots can be published)."""
        return self.client.connected

    def start(self) -> None:
        self.client.start()
        if self.snapshots is not None:
            self.snapshots.start()
            self.web.start()
        if self.config.snapshots.interval_seconds:
            self._stop.clear()
            self._publisher = threading.Thread(target=self._publish_every, daemon=True,
                                               name="collector-publish-snapshots")
            self._publisher.start()

    def stop(self) -> None:
        self._stop.set()
        if self._publisher is not None:
            self._publisher.join(5.0)
            self._publisher = None
        if self.snapshots is not None:
            self.web.stop()
            self.snapshots.stop()
        self.views.stop()
        self.client.stop()

    def latest_channels(self) -> dict:
        """The /api/channels document: the latest snapshot's (computed outside the
        aggregates' lock), or, without one, computed now."""
        latest = self.snapshots.latest if self.snapshots is not None else None
        return latest.documents.channels if latest is not None else self.views.channels_json()

    def publish_snapshots(self) -> None:
        """Every channel's aggregates, retained (``protocol.ChannelSnapshot``)."""
        self.client.publish_snapshots(self.latest_channels())

    def _publish_every(self) -> None:
        every = self.config.snapshots.interval_seconds
        while not self._stop.wait(every):
            try:
                if self.client.connected:
                    self.publish_snapshots()
            except Exception:  # the next period tries again
                log.exception("publishing the retained snapshots failed")
