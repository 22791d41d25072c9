"""The MQTT client behind a narrow interface, and the outbox that feeds it from the spool.

``Transport`` is all the agent needs from MQTT: start, stop, publish, and a
queue of events (connected, disconnected, acknowledged).  ``PahoTransport``
implements it with the product's MQTT client (``edge_agent.common.mqtt_client``);
tests use a fake of their own for logic and the real broker for everything
else.

paho-mqtt keeps unacknowledged messages only in memory (docs/guides/FIELD_NOTES.md,
"paho-mqtt 2.x"), so the
``Outbox`` never relies on it: a message leaves the spool only when the
broker's PUBACK for it arrives, or with ``[delivery] confirm = "collector"``
only when a collector's confirmation names it (``edge_agent.state``).  A
restart re-sends whatever is still spooled, in order; the collector discards
duplicates by (agent, channel, seq).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from edge_agent import protocol
from edge_agent.common.mqtt_client import MqttClient
from edge_agent.config import BrokerConfig, DeliveryConfig
from edge_agent.protocol import Rejected
from edge_agent.state import LANES, REPORTS

log = logging.getLogger(__name__)

CONNECTED, DISCONNECTED, ACKED, MESSAGE = "connected", "disconnected", "acked", "message"
# After a (re)connect, wait this long for the retained confirmations before sending again
# what the broker acknowledged earlier (it may have lost it, or the collector counted it).
CONFIRMATIONS_SETTLE_SECONDS = 2.0
RESEND_CHECK_SECONDS = 5.0


class Transport(Protocol):
    connected: bool
    # Called (from any thread) whenever an event is queued, so that the agent's loop
    # sleeps until there is something to do rather than polling.
    on_event: Callable[[], None] | None

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
    """The agent's MQTT connection (``edge_agent.common.mqtt_client``: MQTT 3.1.1, clean session,
    automatic reconnect), reduced to events the agent loop reads when it likes."""

    def __init__(self, broker: BrokerConfig, *, client_id: str,
                 will: tuple[str, bytes] | None = None):
        self.broker = broker
        self._events: collections.deque = collections.deque()
        self._lock = threading.Lock()
        self.on_event: Callable[[], None] | None = None
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
        if self.on_event is not None:
            self.on_event()

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
    """Moves spooled messages to the transport, in order; they leave the spool once
    acknowledged by the broker, or, with ``delivery.confirm = "collector"``, once a
    collector confirms them (``confirmed``)."""

    def __init__(self, store, transport: Transport, *, window: int = 100,
                 delivery: DeliveryConfig | None = None, on_connect=None, on_message=None):
        self.store = store
        self.transport = transport
        self.window = window
        self.delivery = delivery or DeliveryConfig()
        self.on_connect = on_connect
        self.on_message = on_message  # (topic, payload) of subscribed topics
        self._inflight: dict[int, int] = {}  # message id -> spool row id
        self._direct: set[int] = set()  # message ids of publish() not acknowledged yet
        self._last_sent = dict.fromkeys(LANES, 0)  # per lane: highest spool id handed over
        # Reports go out only once the batch clock has ticked after they were spooled
        # (``release``), never when their computation ends: what the readings make the
        # kernels do is not seen in when a report is published.  What earlier runs
        # spooled may go at once.
        self._released = store.last_spooled()
        self._requeue_acked_before: float | None = None  # set by a (re)connect
        self._requeue_at = 0.0  # monotonic
        self._next_resend_check = 0.0  # monotonic
        self.sent = 0
        self.acked = 0
        self.confirmed_reports = 0
        self.resent = 0

    @property
    def until_confirmed(self) -> bool:
        return self.delivery.confirm == "collector"

    def release(self) -> None:
        """The batch clock ticked: every report spooled until now may go out."""
        self._released = self.store.last_spooled()

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
                if self.until_confirmed:
                    self._requeue_acked_before = time.time()
                    self._requeue_at = time.monotonic() + CONFIRMATIONS_SETTLE_SECONDS
                if self.on_connect is not None:
                    self.on_connect()
            elif kind == DISCONNECTED:
                log.warning("disconnected from the broker (%s); spooling", value)
            elif kind == MESSAGE and self.on_message is not None:
                self.on_message(*value)
        self.store.acknowledge(acked, until_confirmed=self.until_confirmed)
        self.acked += len(acked)
        if self.until_confirmed:
            self._resend_unconfirmed()
        if not self.transport.connected:
            return
        # paho re-sends its own in-flight messages after a reconnect, so only
        # rows never handed over (or sent again, see requeue) go out here, oldest first.
        room = self.window - len(self._inflight)
        in_flight = set(self._inflight.values())
        for lane in LANES:  # range replies first: they answer a round with a deadline
            if room <= 0:
                return
            rows = self.store.pending(self._last_sent[lane], room + len(in_flight), lane,
                                      up_to=self._released if lane == REPORTS else None)
            for row_id, topic, payload, qos in rows:
                self._last_sent[lane] = row_id
                if row_id in in_flight:
                    continue
                mid = self.transport.publish(topic, payload, qos=qos)
                self._inflight[mid] = row_id
                self.sent += 1
                room -= 1
                if room <= 0:
                    return

    def _resend_unconfirmed(self) -> None:
        """After a reconnect, and when confirmations are overdue: reports the broker
        acknowledged become pending again (the collector drops what it has)."""
        now = time.monotonic()
        requeued = 0
        if self._requeue_acked_before is not None and now >= self._requeue_at:
            requeued += self.store.requeue(acked_before=self._requeue_acked_before)
            self._requeue_acked_before = None
        if now >= self._next_resend_check:
            self._next_resend_check = now + RESEND_CHECK_SECONDS
            overdue = self.store.requeue(resend_seconds=self.delivery.resend_seconds)
            if overdue:
                log.warning("%d report(s) acknowledged by the broker but not confirmed by a "
                            "collector within %g s or more: sending them again", overdue,
                            self.delivery.resend_seconds)
            requeued += overdue
        if requeued:
            self.resent += requeued
            self._last_sent[REPORTS] = 0  # they are older than what went out last

    def confirmed(self, topic: str, payload: bytes, fleet: str, agents) -> None:
        """A collector's confirmation (ldp/v1/<fleet>/_confirm/<agent>) for one of
        ``agents``: the reports it names leave the spool."""
        try:
            message = protocol.decode_confirm(topic, payload, fleet)
        except Rejected as exc:
            log.warning("ignored a confirmation on %s: %s", topic[:200], exc.detail)
            return
        if message.agent in agents:
            self.confirmed_reports += self.store.confirm(message.agent, message.channels)

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
        """Nothing left to hand to the broker (confirmations may still be due)."""
        if self.store.spooled == 0:
            return True
        return self.until_confirmed and self.store.spooled == self.store.unconfirmed()
