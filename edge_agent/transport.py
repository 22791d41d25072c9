"""The MQTT client behind a narrow interface, and the outbox that feeds it from the spool.

``Transport`` is all the agent needs from MQTT: start, stop, publish, and a
queue of events (connected, disconnected, acknowledged).  ``PahoTransport``
implements it with paho-mqtt 2.x; tests use ``FakeTransport`` for logic and
the real broker for everything else.

paho-mqtt keeps unacknowledged messages only in memory (NOTES.md), so the
``Outbox`` never relies on it: a message leaves the spool only when the
broker's PUBACK for it arrives.  A restart re-sends whatever is still spooled,
in order; the collector discards duplicates by (agent, channel, seq).
"""

from __future__ import annotations

import collections
import logging
import ssl
import sys
import threading
from typing import Protocol

import paho.mqtt.client as mqtt

from .config import BrokerConfig
from .state import LANES

log = logging.getLogger(__name__)

CONNECTED, DISCONNECTED, ACKED, MESSAGE = "connected", "disconnected", "acked", "message"


class Transport(Protocol):
    connected: bool

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> int:
        """Queue a message; returns its message id (acknowledged later by an ACKED event)."""

    def events(self) -> list[tuple[str, object]]:
        """Events since the last call, oldest first."""

    def subscribe(self, topics: list[str]) -> None:
        """Follow these topics (QoS 1) on every connection; MESSAGE events carry
        (topic, payload)."""


class PahoTransport:
    """paho-mqtt 2.x client (CallbackAPIVersion.VERSION2) with automatic reconnect."""

    def __init__(self, broker: BrokerConfig, *, client_id: str,
                 will: tuple[str, bytes] | None = None):
        self.broker = broker
        self.connected = False
        self._events: collections.deque = collections.deque()
        self._lock = threading.Lock()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id,
                             protocol=mqtt.MQTTv311, clean_session=True)
        if broker.username is not None:
            client.username_pw_set(broker.username, broker.resolved_password())
        if broker.tls is not None:
            tls = broker.tls
            client.tls_set(ca_certs=str(tls.ca) if tls.ca else None,
                           certfile=str(tls.cert) if tls.cert else None,
                           keyfile=str(tls.key) if tls.key else None,
                           cert_reqs=ssl.CERT_REQUIRED)
            client.tls_insecure_set(tls.insecure)
        if will is not None:
            client.will_set(will[0], will[1], qos=1, retain=True)
        client.max_inflight_messages_set(broker.max_inflight)
        client.reconnect_delay_set(min_delay=1, max_delay=30)
        client.on_connect = self._on_connect
        client.on_connect_fail = self._on_connect_fail
        self._connect_error: str | None = None
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        client.on_message = self._on_message
        self.client = client
        self.subscriptions: list[str] = []

    # paho calls these from its network thread; they only record events.
    def _on_connect(self, client, userdata, flags, reason_code, properties):
        if reason_code.is_failure:
            log.warning("broker %s:%s refused the connection: %s", self.broker.host,
                        self.broker.port, reason_code)
            return
        self.connected = True
        self._connect_error = None
        if self.subscriptions:  # a clean session forgets them at every connection
            client.subscribe([(topic, 1) for topic in self.subscriptions])
        self._push((CONNECTED, None))

    def _on_connect_fail(self, client, userdata):
        # paho retries a failed TCP/TLS connect silently; it calls this from
        # inside its ``except OSError``, so the reason (refused, certificate
        # verify failed, hostname mismatch ...) is the exception being handled.
        # Logged when it changes; the retries (every 1-30 s) only at debug level.
        reason = str(sys.exc_info()[1] or "unknown error")
        level = logging.DEBUG if reason == self._connect_error else logging.WARNING
        self._connect_error = reason
        log.log(level, "cannot connect to broker %s:%s: %s", self.broker.host, self.broker.port,
                reason)

    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self.connected = False
        self._push((DISCONNECTED, str(reason_code)))

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        self._push((ACKED, mid))

    def _on_message(self, client, userdata, message):
        self._push((MESSAGE, (message.topic, message.payload)))

    def subscribe(self, topics: list[str]) -> None:
        self.subscriptions = list(topics)
        if self.connected:
            self.client.subscribe([(topic, 1) for topic in self.subscriptions])

    def _push(self, event) -> None:
        with self._lock:
            self._events.append(event)

    def events(self) -> list[tuple[str, object]]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def start(self) -> None:
        self.client.connect_async(self.broker.host, self.broker.port, self.broker.keepalive)
        self.client.loop_start()

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> int:
        return self.client.publish(topic, payload, qos=qos, retain=retain).mid

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
        self.connected = False


class FakeTransport:
    """In-memory transport for logic tests: records publishes, acks on demand."""

    def __init__(self, *, connected: bool = True, auto_ack: bool = True):
        self.connected = connected
        self.auto_ack = auto_ack
        self.published: list[tuple[str, bytes, int, bool]] = []
        self._events: list[tuple[str, object]] = [(CONNECTED, None)] if connected else []
        self._mid = 0
        self.unacked: list[int] = []
        self.subscriptions: list[str] = []

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.connected = False

    def publish(self, topic, payload, *, qos=1, retain=False):
        self._mid += 1
        self.published.append((topic, payload, qos, retain))
        if self.auto_ack and self.connected:
            self._events.append((ACKED, self._mid))
        else:
            self.unacked.append(self._mid)
        return self._mid

    def subscribe(self, topics: list[str]) -> None:
        self.subscriptions = list(topics)

    def deliver(self, topic: str, payload: bytes) -> None:
        """Simulate a message arriving on a subscribed topic."""
        self._events.append((MESSAGE, (topic, payload)))

    def set_connected(self, value: bool) -> None:
        self.connected = value
        self._events.append((CONNECTED if value else DISCONNECTED, None))

    def ack_all(self) -> None:
        self._events.extend((ACKED, mid) for mid in self.unacked)
        self.unacked.clear()

    def events(self):
        events, self._events = self._events, []
        return events


class Outbox:
    """Moves spooled messages to the transport, in order, and deletes them once acked."""

    def __init__(self, store, transport: Transport, *, window: int = 100,
                 on_connect=None, on_message=None):
        self.store = store
        self.transport = transport
        self.window = window
        self.on_connect = on_connect
        self.on_message = on_message  # (topic, payload) of subscribed topics
        self._inflight: dict[int, int] = {}  # message id -> spool row id
        self._direct: set[int] = set()  # message ids of publish() not acknowledged yet
        self._last_sent = dict.fromkeys(LANES, 0)  # per lane: highest spool id handed over
        self.sent = 0
        self.acked = 0

    def pump(self) -> None:
        acked = []
        for kind, value in self.transport.events():
            if kind == ACKED:
                row = self._inflight.pop(value, None)
                if row is not None:
                    acked.append(row)
                else:
                    self._direct.discard(value)
            elif kind == CONNECTED:
                log.info("connected to the broker")
                if self.on_connect is not None:
                    self.on_connect()
            elif kind == DISCONNECTED:
                log.warning("disconnected from the broker (%s); spooling", value)
            elif kind == MESSAGE and self.on_message is not None:
                self.on_message(*value)
        self.store.acknowledge(acked)
        self.acked += len(acked)
        if not self.transport.connected:
            return
        # paho re-sends its own in-flight messages after a reconnect, so only
        # rows never handed over go out here, oldest first.
        room = self.window - len(self._inflight)
        for lane in LANES:  # range replies first: they answer a round with a deadline
            if room <= 0:
                return
            rows = self.store.pending(self._last_sent[lane], room, lane)
            for row_id, topic, payload, qos in rows:
                mid = self.transport.publish(topic, payload, qos=qos)
                self._inflight[mid] = row_id
                self._last_sent[lane] = row_id
                self.sent += 1
            room -= len(rows)

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> int:
        """Publish a message that is not spooled (a retained status); its ack is tracked."""
        mid = self.transport.publish(topic, payload, qos=qos, retain=retain)
        if qos:
            self._direct.add(mid)
        return mid

    @property
    def unacked_direct(self) -> int:
        """Messages of ``publish`` the broker has not acknowledged yet."""
        return len(self._direct)

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    @property
    def idle(self) -> bool:
        return self.store.spooled == 0
