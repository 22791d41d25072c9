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

With ``[broker] shared_group`` the collector is one shard of several: it also
exchanges claims with the other shards and publishes its partial state for
the merge view (``shards.py``, docs/SCALE_OUT.md).
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
    return Ingestor.from_settings(config.fleet, settings_of(config))


def settings_of(config: CollectorConfig) -> dict:
    """The aggregates settings shards and the merge view must share (as in a shard state)."""
    return {"bins": config.aggregates.histogram_bins,
            "window_seconds": config.aggregates.window_seconds,
            "keep_windows": config.aggregates.keep_windows}


def shard_setup(config: CollectorConfig, ingestor: Ingestor) -> None:
    """Give a shard's ingestor its claim book (kept in checkpoints), or take it away."""
    from .shards import ClaimBook

    name, group = config.shard_name, config.broker.shared_group
    timeout = config.shard.peer_timeout_seconds
    if name is None:
        if ingestor.claims is not None:  # no longer a shard: settle what it held alone
            held = list(ingestor.claims.held.values())
            ingestor.claims = None
            for entry in held:
                tracker = ingestor.trackers.get((entry.report.agent, entry.report.channel))
                if tracker is not None and tracker.seen(entry.report.seq):
                    ingestor._duplicate(entry.report)
                else:
                    ingestor._accept(entry.report, entry.received)
    elif ingestor.claims is None:
        ingestor.claims = ClaimBook(name, group, peer_timeout=timeout)
    else:
        ingestor.claims.configure(name, group, peer_timeout=timeout)


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
    shard_setup(config, ingestor)
    position = upto
    for first in range(0, len(journal), READ_BATCH):  # batches bound the codes held at once
        with ingestor.batch():
            for row_id, topic, payload, received in journal[first:first + READ_BATCH]:
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
    statuses = f"{TOPIC_ROOT}/{fleet}/+/status"
    return [statuses] if config.shard.retiring else [shared_subscription(config), statuses]


def shared_subscription(config: CollectorConfig) -> str:
    return f"$share/{config.broker.shared_group}/{data_subscription(config.fleet)}"


def network_settings(config: CollectorConfig) -> dict:
    broker = config.broker
    retiring = config.shard_name is not None and config.shard.retiring
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
            # A retiring shard: leave the shared group, and end the session when stopped.
            "unsubscribe": [shared_subscription(config)] if retiring else [],
            "end_session": retiring,
            "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel())}


def on_range_result(results: dict, message) -> None:
    """A retained range result (ours or any coordinator's) into ``results`` for /api/range."""
    levels = message.topic.split("/")
    try:
        result = json.loads(message.payload)
    except ValueError:
        return
    if len(levels) == 7 and levels[-1] in ("min", "max") and isinstance(result, dict):
        results.setdefault(levels[-2], {})[levels[-1]] = result


def publish_snapshots(client: mqtt.Client, views: Views, fleet: str) -> None:
    """Every channel's aggregates, retained on ``ldp/v1/<fleet>/_aggregates/<channel>``."""
    document = views.channels_json()
    for name, channel in document["channels"].items():
        channel = dict(channel, channel=name, t=document["t"])
        client.publish(aggregates_topic(fleet, name), encode(json_safe(channel)), qos=1,
                       retain=True)


class CollectorService:
    def __init__(self, config: CollectorConfig, *, clock: Callable[[], float] = time.time,
                 web: bool = True):
        self.config = config
        self.clock = clock
        self.lock = threading.RLock()
        self.store = CollectorStore(config.storage.path)
        self.ingestor, self.position = restore(config, self.store)
        self.range_results: dict[str, dict[str, dict]] = {}  # channel -> side -> result
        self.shard = config.shard_name
        self.merge_view = None
        get_ingestor, extra = (lambda: self.ingestor), None
        if self.shard is not None:
            extra = self._shard_json
            if config.shard.serve_merged:
                from .shards import MergeView

                self.merge_view = MergeView(config.fleet, settings_of(config),
                                            group=config.broker.shared_group, exclude=self.shard,
                                            clock=clock)
                get_ingestor = lambda: self.merge_view.ingestor(local=self.ingestor)  # noqa: E731
        self.views = Views(get_ingestor, self.lock, clock, broker_status=self.store.network,
                           range_results=lambda: self.range_results, extra=extra)
        self._claims_arrived = threading.Event()
        self._started, self._replay_settled = clock(), False
        self.last_report: float | None = None  # when the newest report was journaled
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
        topics = [range_result_subscription(self.config.fleet)]
        client.on_message = lambda c, u, message: on_range_result(self.range_results, message)
        if self.shard is not None:
            from .shards import shard_topic

            topics.append(shard_topic(self.config.fleet, "+", "claims"))
            client.message_callback_add(topics[-1], self._on_claims)
            if self.merge_view is not None:
                topics.append(shard_topic(self.config.fleet, "+", "state"))
                client.message_callback_add(
                    topics[-1], lambda c, u, m: self.merge_view.update(m.topic, m.payload))
        client.on_connect = lambda c, *_: c.subscribe([(topic, 1) for topic in topics])
        if self.shard is not None:
            client.on_subscribe = self._on_subscribed
        return client

    def _on_subscribed(self, client, userdata, mid, reason_codes, properties=None) -> None:
        # Peers are heard from only now: a replay or a slow connect must not have used up
        # the wait for them, or held reports would be applied unanswered.
        with self.lock:
            self.ingestor.claims.restart_grace()

    # -- scale-out (docs/SCALE_OUT.md) ----------------------------------------------------------
    def _on_claims(self, client, userdata, message) -> None:
        from .shards import shard_of

        name = shard_of(message.topic, self.config.fleet, "claims")
        if name is None:
            return
        with self.lock:
            self.ingestor.claims.receive(name, message.payload, self.ingestor.trackers,
                                         retained=bool(message.retain))
        self._claims_arrived.set()

    def _shard_json(self) -> dict:
        with self.lock:
            claims = self.ingestor.claims.peers_json()
            counters = {key: self.ingestor.counters[key]
                        for key in ("messages", "values", "duplicates")}
        document = {"shard": {"name": self.shard, "group": self.config.broker.shared_group,
                              "serve_merged": self.merge_view is not None,
                              "retiring": self.config.shard.retiring,
                              "last_report": self.last_report, **claims}}
        if self.merge_view is not None:
            now = self.clock()
            own = {self.shard: {"t": now, "age": 0.0, "received": now, "stale": False,
                                "group": self.config.broker.shared_group, **counters,
                                "bytes": None, "error": None}}
            document.update(self.merge_view.shards_json(local=own))
        return document

    def publish_claims(self) -> None:
        from .shards import shard_topic

        with self.lock:
            payload = self.ingestor.claims.message(self.clock(), self.ingestor.trackers)
        self.publisher.publish(shard_topic(self.config.fleet, self.shard, "claims"), payload,
                               qos=1, retain=True)

    def publish_state(self):
        from .shards import encode_state, shard_topic

        with self.lock:  # encoding (11-14 ms at 326 kB) need not block ingest
            state, now = self.ingestor.to_state(), self.clock()
        payload = encode_state(state, shard=self.shard, group=self.config.broker.shared_group,
                               every=self.config.shard.state_seconds, now=now)
        return self.publisher.publish(shard_topic(self.config.fleet, self.shard, "state"),
                                      payload, qos=1, retain=True)

    def _state_ready(self) -> bool:
        """After a restart the replayed journal is held again: publishing before it is
        applied would show the merge view fewer values than our previous state."""
        if self._replay_settled:
            return True
        with self.lock:
            self._replay_settled = not self.ingestor.claims.held_since_before(self._started)
        return self._replay_settled

    def _apply_held(self) -> None:
        """A retiring shard's last stop: settle what it holds while the peers still answer
        (its session ends, and a report it kept holding would never be counted)."""
        deadline = time.monotonic() + 4 * self.config.shard.peer_timeout_seconds
        while self.ingestor.claims.held and time.monotonic() < deadline and self.connected:
            self.publish_claims()
            self._claims_arrived.wait(self.config.shard.claims_seconds)
            self.settle()
        if self.ingestor.claims.held:
            log.error("retiring shard %s stops with %d report(s) still held; restart it to "
                      "settle them", self.shard, len(self.ingestor.claims.held))

    def settle(self) -> None:
        self._claims_arrived.clear()
        with self.lock, self.ingestor.batch():
            self.ingestor.settle()

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
        with self.lock, self.ingestor.batch():
            for row_id, topic, payload, received in rows:
                if self.ingestor.ingest(topic, payload, received) not in ("status", "ignored"):
                    self.last_report = received
            self.position = rows[-1][0]
        now = time.monotonic()
        if now >= self._progress_due:  # a write per batch would contend with the journal
            self.store.set_progress(self.position)
            self._progress_due = now + PROGRESS_SECONDS
        return len(rows)

    def checkpoint(self) -> None:
        with self.lock:
            claims = self.ingestor.claims
            written = claims.snapshot() if claims is not None else None
            state = pickle.dumps(self.ingestor, protocol=pickle.HIGHEST_PROTOCOL)
            position = self.position
        self.store.checkpoint(state, position)
        if written is not None:
            with self.lock:  # only now may peers record these as seen (docs/SCALE_OUT.md)
                claims.promote(written)

    def publish_snapshots(self) -> None:
        publish_snapshots(self.publisher, self.views, self.config.fleet)

    def _aggregate(self) -> None:
        storage, snapshots, shard = self.config.storage, self.config.snapshots, self.config.shard
        next_checkpoint = time.monotonic() + storage.checkpoint_seconds
        # A shard's own aggregates are partial: it publishes them as its state for
        # the merge view, and snapshots only when it serves the merged view.
        snapshot_every = snapshots.interval_seconds or float("inf")
        if self.shard is not None and self.merge_view is None:
            snapshot_every = float("inf")
        next_snapshot = time.monotonic() + snapshot_every
        next_settle = next_claims = next_state = time.monotonic()
        while not self._stop.is_set():
            try:
                if self.catch_up() < READ_BATCH:
                    self._stop.wait(0.01)  # caught up: poll again shortly
                now = time.monotonic()
                if self.shard is not None:
                    if self._claims_arrived.is_set() or now >= next_settle:
                        self.settle()
                        next_settle = now + 0.1
                    if now >= next_claims and self.connected:
                        self.publish_claims()
                        next_claims = now + shard.claims_seconds
                    if now >= next_state and self.connected and self._state_ready():
                        self.publish_state()
                        next_state = now + shard.state_seconds
                if now >= next_checkpoint:
                    self.checkpoint()
                    self._supervise_network()
                    next_checkpoint = now + storage.checkpoint_seconds
                if now >= next_snapshot and self.connected:
                    self.publish_snapshots()
                    next_snapshot = now + snapshot_every
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
        if self.shard is not None and self.config.shard.retiring:
            self._apply_held()
        self.checkpoint()
        if self.shard is not None and self.connected:  # the merge view's last word from us
            try:
                self.publish_claims()
                if self._state_ready():
                    self.publish_state().wait_for_publish(5)
            except (RuntimeError, ValueError) as exc:
                log.warning("could not publish the final shard state: %s", exc)
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
