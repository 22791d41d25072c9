"""``edge-collector run``: a network process journals, this process aggregates and serves.

Process layout (see ``network.py`` and ``store.py``):

* the network child subscribes (MQTT v5, persistent session, manual
  acknowledgements), appends every message to the SQLite journal and
  acknowledges it only once the journal is committed;
* this process tails the journal in order, validates and aggregates each
  message (``Ingestor``), checkpoints the aggregates with the journal position
  they include, publishes retained snapshots, and serves the web views.

A restart loads the checkpoint and replays the journal after it: exactly
the committed state, while the broker re-sends whatever was not acknowledged.
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
from typing import Callable

import paho.mqtt.client as mqtt

from edge_agent.protocol import TOPIC_ROOT, data_subscription, encode, range_result_subscription

from . import network
from .config import CollectorConfig
from .ingest import Ingestor
from .store import CollectorStore
from .jsonsafe import json_safe
from .range import new_client
from .views import Views

log = logging.getLogger(__name__)

READ_BATCH = 5000
PROGRESS_SECONDS = 0.2  # how often the network child learns how far aggregation got


def aggregates_topic(fleet: str, channel: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/_aggregates/{channel}"


def new_ingestor(config: CollectorConfig) -> Ingestor:
    return Ingestor(fleet=config.fleet, bins=config.aggregates.histogram_bins,
                    window_seconds=config.aggregates.window_seconds,
                    keep_windows=config.aggregates.keep_windows)


def restore(config: CollectorConfig, store: CollectorStore) -> tuple[Ingestor, int]:
    """The checkpointed ingestor with the journal replayed on top, and its journal position."""
    state, upto, journal = store.load()
    if state is None:
        ingestor = new_ingestor(config)
    else:
        ingestor = pickle.loads(state)
        if ingestor.fleet != config.fleet:
            raise ValueError(f"{store.path} holds fleet {ingestor.fleet!r}, the config says "
                             f"{config.fleet!r}: use another storage.path")
    position = upto
    for row_id, topic, payload, received in journal:
        ingestor.ingest(topic, payload, received)
        position = row_id
    if state is not None or journal:
        log.info("restored %d message(s): checkpoint plus %d journaled",
                 ingestor.counters["messages"], len(journal))
    return ingestor, position


def subscriptions(config: CollectorConfig) -> list[str]:
    fleet, group = config.fleet, config.broker.shared_group
    if group is None:
        return [data_subscription(fleet)]
    # Retained statuses are not delivered on shared subscriptions, so every
    # shard also follows the status topics directly.
    return [f"$share/{group}/{data_subscription(fleet)}", f"{TOPIC_ROOT}/{fleet}/+/status"]


def network_settings(config: CollectorConfig) -> dict:
    broker = config.broker
    tls = None
    if broker.tls is not None:
        tls = {k: (str(v) if v is not None and k != "insecure" else v)
               for k, v in broker.tls.model_dump().items()}
    return {"path": str(config.storage.path), "host": broker.host, "port": broker.port,
            "keepalive": broker.keepalive, "client_id": broker.client_id,
            "username": broker.username, "password": broker.resolved_password(), "tls": tls,
            "session_expiry": broker.session_expiry_seconds,
            "mqtt_version": broker.mqtt_version,
            "ack_interval": config.storage.ack_interval_seconds,
            "subscriptions": subscriptions(config),
            "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel())}


class CollectorService:
    def __init__(self, config: CollectorConfig, *, clock: Callable[[], float] = time.time,
                 web: bool = True):
        self.config = config
        self.clock = clock
        self.lock = threading.RLock()
        self.store = CollectorStore(config.storage.path)
        self.ingestor, self.position = restore(config, self.store)
        self.range_results: dict[str, dict[str, dict]] = {}  # channel -> side -> result
        self.views = Views(lambda: self.ingestor, self.lock, clock,
                           broker_status=self.store.network,
                           range_results=lambda: self.range_results)
        self._stop = threading.Event()
        self._stop_requested = threading.Event()  # set by SIGTERM / SIGINT
        self._context = multiprocessing.get_context("spawn")  # the child imports no numba
        self._network_stop = self._context.Event()
        self._network = None
        self._progress_due = 0.0
        self.publisher = self._publisher()
        self.web = None
        if web:
            from .web import WebServer

            self.web = WebServer(self.views, host=config.http.host, port=config.http.port,
                                 push_seconds=config.http.push_seconds)

    @property
    def connected(self) -> bool:
        return self.publisher.is_connected()

    def _publisher(self) -> mqtt.Client:
        """A small clean-session client for what we publish (snapshots)."""
        broker = self.config.broker
        client = new_client(broker, f"{broker.client_id}-publisher")
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        # paho retries a failed TCP/TLS connect silently; the reason is the
        # exception it is handling when it calls this.
        client.on_connect_fail = lambda c, u: log.warning(
            "snapshot publisher cannot connect to broker %s:%s: %s", broker.host, broker.port,
            sys.exc_info()[1] or "unknown error")
        results = range_result_subscription(self.config.fleet)
        client.on_connect = lambda c, *_: c.subscribe(results, qos=1)
        client.on_message = self._on_range_result
        return client

    def _on_range_result(self, client, userdata, message) -> None:
        """Retained range results (ours or any coordinator's) for /api/range."""
        levels = message.topic.split("/")
        try:
            result = json.loads(message.payload)
        except ValueError:
            return
        if len(levels) == 7 and levels[-1] in ("min", "max") and isinstance(result, dict):
            self.range_results.setdefault(levels[-2], {})[levels[-1]] = result

    # -- range discovery (only on the designated coordinator) ----------------------------------
    def channel_domain(self, channel: str) -> tuple[float, float] | None:
        """The widest [low, high] the channel's linear reports have declared."""
        with self.lock:
            series = list(self.ingestor.series.get(channel, {}).values())
        domains = [(s.mechanism["low"], s.mechanism["high"]) for s in series
                   if s.kind == "linear" and "low" in s.mechanism]
        if not domains:
            return None
        return min(d[0] for d in domains), max(d[1] for d in domains)

    def _range_schedule(self) -> None:
        from .range import RangeCoordinator, RunRequest, connect_client

        settings = self.config.range_discovery
        due = {(entry.channel, side): time.monotonic() + min(60.0, entry.every_seconds)
               for entry in settings.schedule for side in entry.sides}
        entries = {entry.channel: entry for entry in settings.schedule}
        coordinator = None
        while not self._stop.wait(1.0):
            for (channel, side), when in sorted(due.items(), key=lambda item: item[1]):
                if time.monotonic() < when or self._stop.is_set():
                    continue
                due[(channel, side)] = time.monotonic() + entries[channel].every_seconds
                domain = entries[channel].domain or self.channel_domain(channel)
                if domain is None:
                    log.info("range discovery for %s waits for its first reports", channel)
                    continue
                try:
                    if coordinator is None:
                        coordinator = RangeCoordinator(
                            connect_client(self.config, settings.client_id),
                            fleet=self.config.fleet, settings=settings)
                    coordinator.run(RunRequest(channel, side, *domain),
                                    expected_agents=self._agents_online())
                except Exception:
                    log.exception("range discovery for %s/%s failed", channel, side)
                    coordinator = None
        if coordinator is not None:
            coordinator.client.disconnect()
            coordinator.client.loop_stop()

    def _agents_online(self) -> int:
        """How many agents a range run can expect (the whole document would compute EMS)."""
        with self.lock:
            now = self.clock()
            return sum(Views._online(stats, now) for stats in self.ingestor.agents.values())

    # -- the network child ----------------------------------------------------------------
    def _start_network(self) -> None:
        self._network = self._context.Process(
            target=network.run, name="collector-network", daemon=True,
            args=(network_settings(self.config), self._network_stop, os.getpid()))
        self._network.start()

    def _supervise_network(self) -> None:
        if self._network is not None and not self._network.is_alive() \
                and not self._network_stop.is_set():
            log.error("the network process exited (code %s); restarting it",
                      self._network.exitcode)
            self._start_network()

    # -- aggregation ------------------------------------------------------------------------
    def catch_up(self) -> int:
        """Apply journal rows committed since the last call; returns how many."""
        rows = self.store.read_journal(self.position, READ_BATCH)
        if not rows:
            return 0
        with self.lock:
            for row_id, topic, payload, received in rows:
                self.ingestor.ingest(topic, payload, received)
            self.position = rows[-1][0]
        now = time.monotonic()
        if now >= self._progress_due:  # a write per batch would contend with the journal
            self.store.set_progress(self.position)
            self._progress_due = now + PROGRESS_SECONDS
        return len(rows)

    def checkpoint(self) -> None:
        with self.lock:
            state = pickle.dumps(self.ingestor, protocol=pickle.HIGHEST_PROTOCOL)
            position = self.position
        self.store.checkpoint(state, position)

    def publish_snapshots(self) -> None:
        document = self.views.channels_json()
        for name, channel in document["channels"].items():
            channel = dict(channel, channel=name, t=document["t"])
            self.publisher.publish(aggregates_topic(self.config.fleet, name),
                                   encode(json_safe(channel)), qos=1, retain=True)

    def _aggregate(self) -> None:
        storage, snapshots = self.config.storage, self.config.snapshots
        next_checkpoint = time.monotonic() + storage.checkpoint_seconds
        next_snapshot = time.monotonic() + (snapshots.interval_seconds or float("inf"))
        while not self._stop.is_set():
            try:
                if self.catch_up() < READ_BATCH:
                    self._stop.wait(0.01)  # caught up: poll again shortly
                now = time.monotonic()
                if now >= next_checkpoint:
                    self.checkpoint()
                    self._supervise_network()
                    next_checkpoint = now + storage.checkpoint_seconds
                if now >= next_snapshot and self.connected:
                    self.publish_snapshots()
                    next_snapshot = now + snapshots.interval_seconds
            except Exception:  # keep aggregating; the next round retries
                log.exception("aggregation step failed")
                self._stop.wait(1.0)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._start_network()
        broker = self.config.broker
        self.publisher.connect_async(broker.host, broker.port, broker.keepalive)
        self.publisher.loop_start()
        self._thread = threading.Thread(target=self._aggregate, name="collector-aggregate",
                                        daemon=True)
        self._thread.start()
        self._range_thread = None
        if self.config.range_discovery.coordinator and self.config.range_discovery.schedule:
            self._range_thread = threading.Thread(target=self._range_schedule,
                                                  name="collector-range", daemon=True)
            self._range_thread.start()
        if self.web is not None:
            self.web.start()
            log.info("dashboard and API on %s", self.web.url)

    def stop(self) -> None:
        self._network_stop.set()  # the child commits, acknowledges and leaves
        if self._network is not None:
            self._network.join(15)
            if self._network.is_alive():
                self._network.kill()
        self._stop.set()
        self._thread.join(15)
        if self._range_thread is not None:
            self._range_thread.join(15)
        while self.catch_up():  # whatever the child committed last
            pass
        self.checkpoint()
        if self.web is not None:
            self.web.stop()
        self.publisher.disconnect()
        self.publisher.loop_stop()
        self.store.close()

    def run_forever(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._stop_requested.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop_requested.set())
        self.start()
        try:
            while not self._stop_requested.wait(0.5):
                pass
        finally:
            self.stop()
        return 0
