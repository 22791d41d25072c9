"""``edge-collector run``: MQTT ingest, durable state, live views.

Threads: paho's network thread calls ``_on_message`` (validate, aggregate,
journal); a maintenance thread commits the journal every
``ack_interval_seconds`` and only then acknowledges those messages to the
broker (paho ``manual_ack``), writes checkpoints and retained snapshots; the
web server answers from the same state under one lock.
"""

from __future__ import annotations

import logging
import pickle
import signal
import threading
import time
from typing import Callable

import paho.mqtt.client as mqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from edge_agent.protocol import TOPIC_ROOT, data_subscription, encode

from .config import CollectorConfig
from .ingest import Ingestor
from .store import CollectorStore
from .views import Views

log = logging.getLogger(__name__)


def aggregates_topic(fleet: str, channel: str) -> str:
    return f"{TOPIC_ROOT}/{fleet}/_aggregates/{channel}"


def restore(config: CollectorConfig, store: CollectorStore) -> Ingestor:
    """The checkpointed ingestor with the journal replayed on top (exactly the last commit)."""
    state, journal = store.load()
    if state is None:
        ingestor = Ingestor(fleet=config.fleet, bins=config.aggregates.histogram_bins,
                            window_seconds=config.aggregates.window_seconds,
                            keep_windows=config.aggregates.keep_windows)
    else:
        ingestor = pickle.loads(state)
        if ingestor.fleet != config.fleet:
            raise ValueError(f"{store.path} holds fleet {ingestor.fleet!r}, the config says "
                             f"{config.fleet!r}: use another storage.path")
    for _, topic, payload, received in journal:
        ingestor.ingest(topic, payload, received)
    if state is not None or journal:
        log.info("restored %d message(s) from the checkpoint and %d from the journal",
                 ingestor.counters["messages"], len(journal))
    return ingestor


class CollectorService:
    def __init__(self, config: CollectorConfig, *, clock: Callable[[], float] = time.time,
                 web: bool = True):
        self.config = config
        self.clock = clock
        self.lock = threading.RLock()
        self.store = CollectorStore(config.storage.path)
        self.ingestor = restore(config, self.store)
        self.views = Views(lambda: self.ingestor, self.lock, clock)
        self._pending_acks: list[int] = []
        self._stop = threading.Event()
        self.connected = threading.Event()
        self.client = self._make_client()
        self.web = None
        if web:
            from .web import WebServer

            self.web = WebServer(self.views, host=config.http.host, port=config.http.port,
                                 push_seconds=config.http.push_seconds)

    # -- MQTT -----------------------------------------------------------------------------
    def _make_client(self) -> mqtt.Client:
        broker = self.config.broker
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=broker.client_id,
                             protocol=mqtt.MQTTv5, manual_ack=True)
        if broker.username is not None:
            client.username_pw_set(broker.username, broker.resolved_password())
        if broker.tls is not None:
            import ssl

            client.tls_set(ca_certs=str(broker.tls.ca) if broker.tls.ca else None,
                           certfile=str(broker.tls.cert) if broker.tls.cert else None,
                           keyfile=str(broker.tls.key) if broker.tls.key else None,
                           cert_reqs=ssl.CERT_REQUIRED)
            client.tls_insecure_set(broker.tls.insecure)
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        client.max_inflight_messages_set(broker.max_inflight)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_message = self._on_message
        return client

    def _connect_properties(self) -> Properties:
        properties = Properties(PacketTypes.CONNECT)
        # A persistent session: the broker keeps our subscription and queues
        # reports while we are away, for this long.
        properties.SessionExpiryInterval = self.config.broker.session_expiry_seconds
        # We acknowledge in groups after each journal commit; let the broker
        # keep many messages in flight meanwhile.
        properties.ReceiveMaximum = 65535
        return properties

    def _subscriptions(self) -> list[tuple[str, int]]:
        fleet = self.config.fleet
        group = self.config.broker.shared_group
        if group is None:
            return [(data_subscription(fleet), 1)]
        # Retained statuses are not delivered on shared subscriptions, so every
        # shard also follows the status topics directly.
        return [(f"$share/{group}/{data_subscription(fleet)}", 1),
                (f"{TOPIC_ROOT}/{fleet}/+/status", 1)]

    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            log.error("broker refused the connection: %s", reason_code)
            return
        log.info("connected to %s:%s (session present: %s)", self.config.broker.host,
                 self.config.broker.port, flags.session_present)
        client.subscribe(self._subscriptions())
        self.connected.set()

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.connected.clear()
        if not self._stop.is_set():
            log.warning("disconnected from the broker: %s", reason_code)
        with self.lock:
            # Unacknowledged messages come again after reconnecting; they are
            # journaled already, so dedup recognises them.
            self._pending_acks.clear()

    def _on_message(self, client, userdata, message):
        topic, payload = message.topic, message.payload
        now = self.clock()
        with self.lock:
            outcome = self.ingestor.ingest(topic, payload, now)
            if outcome in ("ignored", "status") or message.qos == 0:
                # Nothing to make durable: statuses are retained by the broker.
                acked_now = True
            else:
                self.store.append(topic, payload, now)
                acked_now = False
                self._pending_acks.append(message.mid)
        if acked_now and message.qos > 0:
            client.ack(message.mid, message.qos)

    # -- durability -----------------------------------------------------------------------
    def commit_and_ack(self) -> None:
        with self.lock:
            self.store.commit()
            acks, self._pending_acks = self._pending_acks, []
        for mid in acks:
            self.client.ack(mid, 1)

    def checkpoint(self) -> None:
        with self.lock:
            state = pickle.dumps(self.ingestor, protocol=pickle.HIGHEST_PROTOCOL)
            self.store.checkpoint(state)
            acks, self._pending_acks = self._pending_acks, []
        for mid in acks:
            self.client.ack(mid, 1)

    def publish_snapshots(self) -> None:
        document = self.views.channels_json()
        for name, channel in document["channels"].items():
            channel = dict(channel, channel=name, t=document["t"])
            self.client.publish(aggregates_topic(self.config.fleet, name),
                                encode(_json_safe(channel)), qos=1, retain=True)

    def _maintenance(self) -> None:
        storage, snapshots = self.config.storage, self.config.snapshots
        next_checkpoint = time.monotonic() + storage.checkpoint_seconds
        next_snapshot = time.monotonic() + (snapshots.interval_seconds or float("inf"))
        while not self._stop.wait(storage.ack_interval_seconds):
            try:
                self.commit_and_ack()
                now = time.monotonic()
                if now >= next_checkpoint:
                    self.checkpoint()
                    next_checkpoint = now + storage.checkpoint_seconds
                if now >= next_snapshot and self.connected.is_set():
                    self.publish_snapshots()
                    next_snapshot = now + snapshots.interval_seconds
            except Exception:  # keep ingesting; the next round retries
                log.exception("maintenance step failed")

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        broker = self.config.broker
        self.client.connect_async(broker.host, broker.port, broker.keepalive,
                                  clean_start=False, properties=self._connect_properties())
        self.client.loop_start()
        self._thread = threading.Thread(target=self._maintenance, name="collector-maintenance",
                                        daemon=True)
        self._thread.start()
        if self.web is not None:
            self.web.start()
            log.info("dashboard and API on %s", self.web.url)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        if self.web is not None:
            self.web.stop()
        self.checkpoint()  # journal committed and trimmed; pending messages acked
        time.sleep(0.1)  # let paho flush the acks
        self.client.disconnect()
        self.client.loop_stop()
        self.store.close()

    def run_forever(self) -> int:
        signal.signal(signal.SIGTERM, lambda *_: self._stop.set())
        signal.signal(signal.SIGINT, lambda *_: self._stop.set())
        self.start()
        try:
            while not self._stop.wait(0.5):
                pass
        finally:
            self.stop()
        return 0


def _json_safe(value):
    """NaN and infinities become null (MQTT dashboards parse strict JSON)."""
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value

