"""``edge-collector run``: a network process journals, this process aggregates and serves.

The service composes its parts, each in its own module:

* ``network.NetworkProcess``: the child that subscribes (MQTT v5, persistent
  session, manual acknowledgements), appends every message to the SQLite
  journal and acknowledges it only once the journal is committed;
* ``checkpoint``: the aggregates saved with the journal position they
  include, and restored at start (the journal after it replayed);
* the aggregation loop here: tail the journal in order, validate and
  aggregate each message (``ingest.Ingestor``), checkpoint, publish;
* ``front.ServingFront``: the dashboard, API and metrics, the retained
  snapshots out and the range results in, as the merge view serves them;
* ``range.schedule.RangeSchedule``: periodic range discovery, on the designated
  coordinator only;
* ``results.recorder.ResultsRecorder``: every window closed at a checkpoint, written to
  the results store once that checkpoint is committed (``collector.results``).

A restart loads the checkpoint and replays the journal after it: exactly the
committed state, while the broker re-sends whatever was not acknowledged.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable

from collector.api.documents import Views
from collector.broker.network import NetworkProcess
from collector.broker.settings import network_settings
from collector.config import CollectorConfig, ConfigError, load_registry
from collector.front import ServingFront
from collector.range.schedule import RangeSchedule
from collector.results.backends import open_results_store
from collector.results.recorder import ResultsRecorder
from collector.storage import checkpoint
from collector.storage.checkpoint import restore
from collector.storage.store import CollectorStore
from edge_agent import protocol
from edge_agent.common.memory import release_freed_memory

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 0.2  # how often the network child learns how far aggregation got
CHECKPOINT_RETRY_SECONDS = 5.0
# Late reports spread over more windows than a series keeps close them early, at most
# this often.
OVERFULL_CHECKPOINT_SECONDS = 1.0


class CollectorService:
    def __init__(self, config: CollectorConfig, *, clock: Callable[[], float] = time.time,
                 web: bool = True):
        self.config = config
        self.clock = clock
        self.lock = threading.RLock()
        self.store = CollectorStore(config.storage.path)
        self.results = open_results_store(config)
        self.ingestor, self.position = restore(config, self.store, recording=True)
        if self.ingestor.source is None:  # batches are numbered per checkpoint: its name
            self.ingestor.source = uuid.uuid4().hex
        self.recorder = ResultsRecorder(
            self.results, source=self.ingestor.source,
            aggregates=lambda: self.ingestor, lock=self.lock, retention=config.retention(),
            clock=clock, closed_sums=self.store.closed_sums)
        self.recorder.durable = self.ingestor.flushes  # the restored batches are durable
        self.front = ServingFront(config, lambda: self.ingestor, self.lock, role="publisher",
                                  label="snapshot publisher", clock=clock,
                                  broker_status=self.store.network, web=web,
                                  results=self.results)
        if self.front.web is not None:
            self.front.web.register(self.recorder)
        self.network = NetworkProcess(network_settings(config))
        discovery = config.range_discovery
        self.range_schedule = RangeSchedule(config, channel_domain=self.channel_domain,
                                            agents_online=self.agents_online) \
            if discovery.coordinator and discovery.schedule else None
        self._stop = threading.Event()
        self._stop_requested = threading.Event()  # set by SIGTERM / SIGINT
        self._reload_requested = threading.Event()  # set by SIGHUP
        self._progress_due, self._progress_saved = 0.0, -1

    @property
    def connected(self) -> bool:
        """Whether the snapshot publisher is connected."""
        return self.front.connected

    # -- what range discovery asks --------------------------------------------------------------
    def channel_domain(self, channel: str) -> tuple[float, float] | None:
        """The widest [low, high] the channel's linear reports have declared."""
        with self.lock:
            series = list(self.ingestor.series.get(channel, {}).values())
        domains = [domain for domain in (s.domain() for s in series) if domain is not None]
        if not domains:
            return None
        return min(d[0] for d in domains), max(d[1] for d in domains)

    def agents_online(self) -> int:
        """How many agents a range run can expect (the whole document would compute EMS)."""
        with self.lock:
            now = self.clock()
            return sum(Views.online(stats, now) for stats in self.ingestor.agents.values())

    # -- aggregation ------------------------------------------------------------------------
    def catch_up(self) -> bool:
        """Apply journal rows committed since the last call; True if more may be waiting.

        Every row moves the position on, whatever becomes of it: the ingestor refuses
        what it cannot count (``Ingestor.ingest`` never raises for a message), so no
        message can stop the ones after it."""
        rows, more = self.store.read_journal(self.position)
        if not rows:
            return False
        with self.lock, self.ingestor.batch():
            for row_id, topic, payload, received in rows:
                self.ingestor.ingest(topic, payload, received)
                self.position = row_id
        return more

    def save_progress(self) -> None:
        """Tell the network child how far aggregation got: at most every
        ``PROGRESS_SECONDS`` (a write per batch would contend with the journal), and
        also once caught up, so the last batch is not left unreported."""
        now = time.monotonic()
        if self.position != self._progress_saved and now >= self._progress_due:
            self.store.set_progress(self.position)
            self._progress_saved, self._progress_due = self.position, now + PROGRESS_SECONDS

    def checkpoint(self) -> bool:
        """Save the aggregates with the journal position they include; False (logged,
        nothing changed on disk) if that failed: the next attempt writes it all again."""
        # Written under the lock: the state is encoded as SQLite takes it (no copy of it
        # whole), while the aggregates do not change.
        with self.lock:
            self.ingestor.close_windows(self.clock(), self.config.results.close_after_seconds)
            flushes = self.ingestor.flushes
            confirmations = self.ingestor.confirmations(self.clock()) \
                if self.config.storage.confirmations else {}
            unsaved = self.ingestor.unsaved()
            # Each closed window's sums are written once, from the bytes it holds.
            closed = ((batch, seq, window.sums) for batch, windows in unsaved
                      for seq, window in enumerate(windows))
            try:
                self.store.checkpoint(checkpoint.dump_parts(self.ingestor), self.position,
                                      trim=not self.config.storage.keep_journal,
                                      closed=closed, pending=list(self.ingestor.pending))
            except Exception as exc:  # e.g. a full disk: the journal keeps everything meanwhile
                log.error("checkpoint failed (%s: %s); retrying in %.0f s",
                          type(exc).__name__, exc, CHECKPOINT_RETRY_SECONDS)
                self.ingestor.unconfirmed.update(confirmations)  # confirmed next time
                return False
            self.ingestor.saved(batch for batch, _ in unsaved)
        del unsaved
        # The encoding's transient (tens of MB at the default limits), and LLVM's code
        # pages (edge_agent.common.memory).
        release_freed_memory()
        self.recorder.wake(flushes)
        self.publish_confirmations(confirmations)
        return True

    def publish_confirmations(self, confirmations: dict[str, bytes]) -> None:
        """What is now durable, to each agent (retained: a reconnecting agent gets it at
        once); not connected: at the next checkpoint."""
        if not self.front.connected:
            with self.lock:
                self.ingestor.unconfirmed.update(confirmations)
            return
        for agent, payload in confirmations.items():
            self.front.client.publish(protocol.confirm_topic(self.config.fleet, agent), payload)

    def reload_registry(self) -> bool:
        """Re-read the registry file (SIGHUP); on an error the registry in force stays."""
        registry = self.config.registry
        if registry.agents != "registered":
            log.info("SIGHUP: no registry to reload ([registry] agents = \"any\")")
            return False
        try:
            agents = load_registry(registry.file)
        except ConfigError as exc:
            log.error("registry not reloaded, the previous one stays: %s", exc)
            return False
        with self.lock:
            self.ingestor.limits = dataclasses.replace(self.ingestor.limits, registry=agents)
        log.info("registry reloaded from %s: %d agents", registry.file, len(agents))
        return True

    def _aggregate(self) -> None:
        storage = self.config.storage
        next_checkpoint = time.monotonic() + storage.checkpoint_seconds
        self._checked_at = time.monotonic()
        while not self._stop.is_set():
            try:
                if self._reload_requested.is_set():
                    self._reload_requested.clear()
                    self.reload_registry()
                if not self.catch_up():
                    self._stop.wait(0.01)  # caught up: poll again shortly
                self.save_progress()
                now = time.monotonic()
                if self.ingestor.overfull:
                    next_checkpoint = min(next_checkpoint,
                                          self._checked_at + OVERFULL_CHECKPOINT_SECONDS)
                if now >= next_checkpoint:
                    self._checked_at = now
                    next_checkpoint = now + (storage.checkpoint_seconds if self.checkpoint()
                                             else CHECKPOINT_RETRY_SECONDS)
                self.network.supervise()
            except Exception:  # keep aggregating; the next round retries
                log.exception("aggregation step failed")
                self._stop.wait(1.0)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self.recorder.start()
        self.network.start()
        self._thread = threading.Thread(target=self._aggregate, name="collector-aggregate",
                                        daemon=True)
        self._thread.start()
        if self.range_schedule is not None:
            self.range_schedule.start()
        self.front.start()

    def stop(self) -> None:
        self.network.stop()  # the child commits, acknowledges and leaves
        self._stop.set()
        self._thread.join(15)
        if self.range_schedule is not None:
            self.range_schedule.stop()
        while self.catch_up():  # whatever the child committed last
            pass
        self.checkpoint()
        self.recorder.stop()  # after a last pass: the last checkpoint's batch
        self.front.stop()
        self.store.close()
        self.results.close()

    def run_forever(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._stop_requested.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop_requested.set())
        signal.signal(signal.SIGHUP, lambda *_: self._reload_requested.set())
        self.start()
        try:
            while not self._stop_requested.wait(0.5):
                pass
        finally:
            self.stop()
        return 0
