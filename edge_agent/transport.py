"""The MQTT client behind a narrow interface, and the outbox that feeds it from the spool.

``Transport`` is all the agent needs from MQTT: start, stop, publish, and a
queue of events (connected, disconnected, acknowledged).  ``PahoTransport``
implements it with the product's MQTT client (``edge_agent.mqtt_client``);
tests use a fake of their own for logic and the real broker for everything
else.

paho-mqtt keeps unacknowledged messages only in memory (NOTES.md), so the
``Outbox`` never relies on it: a message leaves the spool only when the
broker's PUBACK for it arrives.  A restart re-sends whatever is still spooled,
in order; the collector discards duplicates by (agent, channel, seq).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Protocol

from .config import BrokerConfig
from .mqtt_client import MqttClient
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
    """The agent's MQTT connection (``edge_agent.mqtt_client``: MQTT 3.1.1, clean session,
    automatic reconnect), reduced to events the agent loop reads when it likes."""

    def __init__(self, broker: BrokerConfig, *, client_id: str,
                 will: tuple[str, bytes] | None = None):
        self.broker = broker
        self._events: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self.client = MqttClient(broker.endpoint(), client_id, log=log, will=will,
                                 max_inflight=broker.max_inflight,
                                 on_connected=lambda client, flags: self._push((CONNECTED, None)))
        self.client.on_disconnect = self._on_disconnect
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message

    @property
    def connected(self) -> bool:
        return self.client.is_connected()

    # paho calls these from its network thread; they only record events.
    def _on_disconnect(self, client, userdata, flags, reason_code, properties):
        self._push((DISCONNECTED, str(reason_code)))

    def _on_publish(self, client, userdata, mid, reason_code, properties):
        self._push((ACKED, mid))

    def _on_message(self, client, userdata, message):
        self._push((MESSAGE, (message.topic, message.payload)))

    def subscribe(self, topics: list[str]) -> None:
        self.client.follow(topics)

    def _push(self, event) -> None:
        with self._lock:
            self._events.append(event)

    def events(self) -> list[tuple[str, object]]:
        with self._lock:
            events = list(self._events)
            self._events.clear()
        return events

    def start(self) -> None:
        self.client.start()

    def publish(self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False) -> int:
        return self.client.publish(topic, payload, qos=qos, retain=retain).mid

    def stop(self) -> None:
        self.client.stop()


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
